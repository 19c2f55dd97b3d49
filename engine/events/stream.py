"""The events the engine streams to the app, and their JSON-lines form. Pure data (no torch).

Every stream ends in exactly one terminal event: `Finished` or `Failed` for a generation, `Loaded`
or `Failed` for a load.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

# "unloaded" ends an unload command's stream; the others end a generation (or a cancelled load)
# "repetition": the answer was repeating itself (generate/loop_guard.py), where the request asked
# for the guard
FINISH_REASONS = ("eos", "stop_string", "max_tokens", "repetition", "cancelled", "unloaded")


@dataclass(frozen=True)
class LoadProgress:
    """A stage of loading; done/total in the stage's own unit (tensors, layers, steps)."""

    name: ClassVar[str] = "load_progress"
    stage: str
    done: int
    total: int
    message: str = ""


@dataclass(frozen=True)
class Loaded:
    """Terminal event of a successful load: what was loaded and how."""

    name: ClassVar[str] = "loaded"
    model: str
    architecture: str
    device: str
    quant: str
    kv_dtype: str
    context: int
    weights_bytes: int
    kv_cache_bytes: int
    notes: tuple[str, ...] = ()
    pid: int = 0
    # the load's resolved configuration (EngineConfig.as_dict: placement, KV dtype, prefill
    # chunk, backend settings and the decode path they came to); {} from remote endpoints
    config: dict = field(default_factory=dict, hash=False, compare=False)
    # what a generation's unset sampling settings take: temperature, top_p, top_k (0: off),
    # repetition_penalty and their "source" (formats/sampling_defaults.py); {} where unknown (a
    # remote endpoint's)
    sampling: dict = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class PrefillProgress:
    name: ClassVar[str] = "prefill_progress"
    done: int
    total: int


@dataclass(frozen=True)
class Token:
    """Text is what becomes visible with these ids; it may be empty (an incomplete UTF-8 char)."""

    name: ClassVar[str] = "token"
    text: str
    token_ids: tuple[int, ...]
    # where the request asked for logprobs, one (logprob, top) per id: the chosen token's log
    # probability and the likeliest tokens' (id, logprob) pairs, most likely first
    logprobs: tuple[tuple[float, tuple[tuple[int, float], ...]], ...] | None = None


@dataclass(frozen=True)
class Stats:
    name: ClassVar[str] = "stats"
    prompt_tokens: int = 0
    new_tokens: int = 0
    ttft_ms: float = 0.0
    prefill_tokens_per_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    accepted_draft_tokens: int = 0
    proposed_draft_tokens: int = 0
    # speculative decoding; 0 / "" when off. Mean accepted length: tokens a verify pass yields
    # (its accepted proposals plus the target's own token). Speedup: the measured time per
    # token of a plain step over that of speculation, 0 until both were measured.
    speculation: str = ""  # "draft", "prompt_lookup" or "synthetic"
    num_speculative_tokens: int = 0  # the K in use now (adaptive)
    mean_accepted_length: float = 0.0
    acceptance_rate: float = 0.0  # per proposal, given the ones before it were accepted
    speculative_speedup: float = 0.0
    speculation_switched_off: bool = False  # not paying for itself now: plain steps for a while
    vram_used_bytes: int = 0
    kv_cache_bytes: int = 0
    context_used_tokens: int = 0
    # of prompt_tokens: how many had their K/V from an earlier turn (prompt_eval_count in
    # Ollama's terms is the computed part)
    cached_prompt_tokens: int = 0
    computed_prompt_tokens: int = 0
    # the oldest messages after the system prompt left out so the conversation fits the context
    dropped_messages: int = 0
    pid: int = 0


@dataclass(frozen=True)
class Finished:
    name: ClassVar[str] = "finished"
    reason: str
    stats: Stats = field(default_factory=Stats)


@dataclass(frozen=True)
class Failed:
    """error: one sentence for the user; hint: what to do about it (may be empty)."""

    name: ClassVar[str] = "failed"
    error: str
    hint: str = ""
    bad_input: bool = False


@dataclass(frozen=True)
class Serving:
    """The worker's server listens: its base URL (http://host:port/v1)."""

    name: ClassVar[str] = "serving"
    url: str


@dataclass(frozen=True)
class ServerStats:
    """The worker's server, about once a second while it serves."""

    name: ClassVar[str] = "server_stats"
    url: str
    num_clients: int = 0  # open HTTP connections
    num_running: int = 0  # generations of every client of the engine, the window's too
    num_waiting: int = 0
    tokens_per_s: float = 0.0  # over the last interval, all clients together


@dataclass(frozen=True)
class ServerStopped:
    """The worker's server has stopped: asked to (error "") or it could not go on."""

    name: ClassVar[str] = "server_stopped"
    error: str = ""


EVENTS = {c.name: c for c in (LoadProgress, Loaded, PrefillProgress, Token, Stats, Finished,
                              Failed, Serving, ServerStats, ServerStopped)}
TERMINAL = (Finished, Failed, Loaded)


def event_to_json(ev) -> str:
    body = {"event": ev.name, **dataclasses.asdict(ev)}
    if isinstance(ev, Token) and ev.logprobs is None:
        del body["logprobs"]  # a token line stays as it was where none were asked for
    line = json.dumps(body, ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate in some text: escaped, the pipe stays UTF-8
        line = json.dumps(body)
    return line


def event_from_json(line: str):
    obj: dict[str, Any] = json.loads(line)
    cls = EVENTS[obj.pop("event")]
    if cls is Finished:
        obj["stats"] = Stats(**obj.get("stats", {}))
    for key in ("token_ids", "notes"):
        if key in obj:
            obj[key] = tuple(obj[key])
    if obj.get("logprobs") is not None:
        obj["logprobs"] = tuple((lp, tuple(map(tuple, top))) for lp, top in obj["logprobs"])
    return cls(**obj)
