"""The whole app-to-engine contract: requests in, events out, and their JSON-lines form.

Pure data (no torch): the Qt app imports this module. Every stream of events ends in exactly one
terminal event: `Finished` or `Failed` for a generation, `Loaded` or `Failed` for a load.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

# "unloaded" ends an unload command's stream; the others end a generation (or a cancelled load)
FINISH_REASONS = ("eos", "stop_string", "max_tokens", "cancelled", "unloaded")


class BadRequest(ValueError):
    """A request that can never succeed as written: one sentence, shown to the user as is."""


# ---------------------------------------------------------------- requests (app -> engine)


@dataclass(frozen=True)
class SamplingParams:
    """None means: take the model's generation_config.json default, else the engine's."""

    temperature: float | None = None  # 0 is greedy
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    seed: int | None = None

    def validate(self) -> None:
        if self.temperature is not None and not self.temperature >= 0:
            raise BadRequest(f"temperature must be 0 or more, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise BadRequest(f"top-p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 0:
            raise BadRequest(f"top-k must be 0 (off) or more, got {self.top_k}")
        if self.repetition_penalty is not None and not self.repetition_penalty > 0:
            raise BadRequest(f"repetition penalty must be above 0, got {self.repetition_penalty}")


@dataclass(frozen=True)
class LoadRequest:
    command: ClassVar[str] = "load"
    model: str | None = None  # a folder or a cached Hugging Face repo id; None: the demo model
    quant: str = "auto"
    kv_dtype: str = "auto"
    context: int | None = None
    device: str = "auto"
    memory_limit_gib: float | None = None
    eager: bool = False  # decode through transformers' modules: the reference, no fast path
    compile: bool = False  # torch.compile the fused layer (slow first load, cached after)
    draft: str | None = None  # a draft model folder (same tokenizer): speculative decoding
    num_speculative_tokens: int | None = None  # fixed K for every generation; None: adaptive
    tensor_parallel: int = 1  # GPUs the model is cut across (tp_session.py); 1: one device
    lm_head: str = "16bit"  # "int8" / "int4": a quantized copy of the lm_head (lm_head.py)

    def validate(self) -> None:
        if self.quant not in QUANTS:
            raise BadRequest(f"unknown --quant {self.quant!r}; choose one of {', '.join(QUANTS)}")
        if self.kv_dtype not in KV_DTYPES:
            raise BadRequest(
                f"unknown --kv-dtype {self.kv_dtype!r}; choose one of {', '.join(KV_DTYPES)}"
            )
        if self.device not in ("auto", "cuda", "cpu"):
            raise BadRequest(f"unknown --device {self.device!r}; choose auto, cuda or cpu")
        if self.context is not None and self.context < 16:
            raise BadRequest(f"context must be at least 16 tokens, got {self.context}")
        if self.memory_limit_gib is not None and not self.memory_limit_gib > 0:
            raise BadRequest(f"memory limit must be above 0 GiB, got {self.memory_limit_gib}")
        _check_speculative_tokens(self.num_speculative_tokens, minimum=1)
        if self.lm_head not in LM_HEADS:
            raise BadRequest(f"unknown --lm-head {self.lm_head!r}; choose one of "
                             f"{', '.join(LM_HEADS)}")
        if self.lm_head != "16bit" and self.tensor_parallel != 1:
            raise BadRequest("--tensor-parallel cuts a 16-bit lm_head only; leave out --lm-head")
        self._check_tensor_parallel()

    def _check_tensor_parallel(self) -> None:
        n = self.tensor_parallel
        if type(n) is not int or n < 1:  # not bool, not 2.0: a JSON command is taken as sent
            raise BadRequest(f"--tensor-parallel takes a whole number of GPUs, 1 or more, "
                             f"got {n!r}")
        if n == 1:
            return
        # what tensor_parallel.py cuts and tp_worker.py caches today: 16-bit weights and KV
        if self.quant in ("int8", "nf4", "awq"):
            raise BadRequest(f"--tensor-parallel cuts 16-bit weights only so far; use --quant "
                             f"bf16 or auto, not {self.quant}")
        if self.kv_dtype in ("fp8", "int8"):
            raise BadRequest(f"--tensor-parallel keeps a 16-bit KV cache so far; use --kv-dtype "
                             f"auto or bf16, not {self.kv_dtype}")
        if self.draft is not None:
            raise BadRequest("a draft model does not run beside --tensor-parallel yet; "
                             "--prompt-lookup does")
        if self.eager:
            raise BadRequest("--eager decodes through transformers' modules on one device; "
                             "leave it out with --tensor-parallel")


MAX_SPECULATIVE_TOKENS = 16


def _check_speculative_tokens(k: int | None, minimum: int) -> None:
    if k is not None and not minimum <= k <= MAX_SPECULATIVE_TOKENS:
        raise BadRequest(f"the number of speculative tokens must be {minimum} to "
                         f"{MAX_SPECULATIVE_TOKENS}, got {k}")


QUANTS = ("auto", "bf16", "fp16", "fp32", "int8", "nf4", "awq")
KV_DTYPES = ("auto", "bf16", "fp16", "fp32", "fp8", "int8")
LM_HEADS = ("16bit", "int8", "int4")


@dataclass(frozen=True)
class GenerateRequest:
    """Exactly one of `prompt`, `messages` or `prompt_ids` (token ids, sent as they are).

    `raw` tokenizes the prompt as is, no template. `ignore_eos` (benchmarks) runs to max tokens.
    Speculation: a session loaded with a draft uses it; `prompt_lookup` proposes from n-gram
    matches in the conversation instead; `num_speculative_tokens` fixes K for this request
    (None: the session's choice, adaptive unless fixed at load; 0: no speculation).
    """

    command: ClassVar[str] = "generate"
    prompt: str | None = None
    messages: tuple[dict, ...] | None = None
    prompt_ids: tuple[int, ...] | None = None
    ignore_eos: bool = False
    system: str | None = None
    raw: bool = False
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prompt_lookup: bool = False
    num_speculative_tokens: int | None = None

    def validate(self) -> None:
        if sum(x is not None for x in (self.prompt, self.messages, self.prompt_ids)) != 1:
            raise BadRequest("give exactly one of a prompt, a list of messages or token ids")
        if self.raw and self.messages is not None:
            raise BadRequest("raw mode takes a prompt, not a list of messages")
        if self.max_new_tokens < 1:
            raise BadRequest(f"max new tokens must be at least 1, got {self.max_new_tokens}")
        for m in self.messages or ():
            if not isinstance(m, dict) or not isinstance(m.get("content"), str) or m.get(
                "role"
            ) not in ("system", "user", "assistant"):
                raise BadRequest(
                    "each message must be an object with a role (system, user or assistant) "
                    "and a string content"
                )
        if any(not s for s in self.stop):
            raise BadRequest("stop strings must not be empty")
        _check_speculative_tokens(self.num_speculative_tokens, minimum=0)
        self.sampling.validate()


@dataclass(frozen=True)
class CancelRequest:
    command: ClassVar[str] = "cancel"


@dataclass(frozen=True)
class UnloadRequest:
    command: ClassVar[str] = "unload"


@dataclass(frozen=True)
class ShutdownRequest:
    command: ClassVar[str] = "shutdown"


REQUESTS = {c.command: c for c in (LoadRequest, GenerateRequest, CancelRequest, UnloadRequest,
                                   ShutdownRequest)}


def request_to_json(req) -> str:
    body = dataclasses.asdict(req)
    return json.dumps({"command": req.command, **body}, ensure_ascii=False)


def request_from_json(line: str):
    """Parse one command line; raises BadRequest with a one-sentence reason."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise BadRequest(f"command is not valid JSON: {e.msg}") from None
    if not isinstance(obj, dict) or obj.get("command") not in REQUESTS:
        raise BadRequest(f"unknown command; expected one of {', '.join(REQUESTS)}")
    cls = REQUESTS[obj.pop("command")]
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(obj) - names
    if unknown:
        raise BadRequest(f"unknown field(s) for {cls.command}: {', '.join(sorted(unknown))}")
    if cls is GenerateRequest:
        if "sampling" in obj:
            s = obj["sampling"] or {}
            s_names = {f.name for f in dataclasses.fields(SamplingParams)}
            if not isinstance(s, dict) or set(s) - s_names:
                raise BadRequest("sampling must be an object with known fields only")
            obj["sampling"] = SamplingParams(**s)
        for key in ("messages", "prompt_ids"):
            if obj.get(key) is not None:
                obj[key] = tuple(obj[key])
        obj["stop"] = tuple(obj.get("stop") or ())
    try:
        return cls(**obj)
    except TypeError as e:
        raise BadRequest(f"malformed {cls.command} command: {e}") from None


# ---------------------------------------------------------------- events (engine -> app)


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


EVENTS = {c.name: c for c in (LoadProgress, Loaded, PrefillProgress, Token, Stats, Finished,
                              Failed)}
TERMINAL = (Finished, Failed, Loaded)


def event_to_json(ev) -> str:
    return json.dumps({"event": ev.name, **dataclasses.asdict(ev)}, ensure_ascii=False)


def event_from_json(line: str):
    obj: dict[str, Any] = json.loads(line)
    cls = EVENTS[obj.pop("event")]
    if cls is Finished:
        obj["stats"] = Stats(**obj.get("stats", {}))
    for key in ("token_ids", "notes"):
        if key in obj:
            obj[key] = tuple(obj[key])
    return cls(**obj)
