"""The whole app-to-engine contract: requests in (requests.py), events out (stream.py), and their
JSON-lines form (request_json.py, stream.py). Pure data, no torch: the Qt app imports it.

Every public name is importable from `engine.events` itself, as the app and the engine do.
"""

from engine.events.grammar_spec import GrammarSpec
from engine.events.request_json import MAX_NESTING, request_from_json, request_to_json
from engine.events.requests import (
    LM_HEADS,
    MAX_PATH_CHARS,
    MAX_SEED,
    MAX_SPECULATIVE_TOKENS,
    MAX_TOP_K,
    REQUESTS,
    BadRequest,
    CancelRequest,
    GenerateRequest,
    LoadRequest,
    SamplingParams,
    ServeRequest,
    ServeStopRequest,
    ShutdownRequest,
    UnloadRequest,
    kv_dtype_choices,
    quant_choices,
)
from engine.events.stream import (
    EVENTS,
    FINISH_REASONS,
    TERMINAL,
    Failed,
    Finished,
    Loaded,
    LoadProgress,
    PrefillProgress,
    ServerStats,
    ServerStopped,
    Serving,
    Stats,
    Token,
    event_from_json,
    event_to_json,
)

__all__ = [
    "EVENTS", "FINISH_REASONS", "LM_HEADS", "MAX_NESTING", "MAX_PATH_CHARS", "MAX_SEED",
    "MAX_SPECULATIVE_TOKENS", "MAX_TOP_K", "REQUESTS", "TERMINAL", "BadRequest", "CancelRequest",
    "Failed", "Finished", "GenerateRequest", "GrammarSpec", "LoadProgress", "LoadRequest", "Loaded",
    "PrefillProgress", "SamplingParams", "ServeRequest", "ServeStopRequest", "ServerStats",
    "ServerStopped", "Serving", "ShutdownRequest", "Stats", "Token", "UnloadRequest",
    "event_from_json", "event_to_json", "kv_dtype_choices", "quant_choices", "request_from_json",
    "request_to_json",
]
