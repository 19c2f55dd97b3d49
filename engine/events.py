"""The whole app-to-engine contract: requests in, events out, and their JSON-lines form.

Pure data (no torch): the Qt app imports this module. Every stream of events ends in exactly one
terminal event: `Finished` or `Failed` for a generation, `Loaded` or `Failed` for a load.
"""

from __future__ import annotations

import dataclasses
import json
import math
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
        # `not (...)` so that NaN fails too; inf is no temperature or penalty a sampler can use
        t, p, k, r = self.temperature, self.top_p, self.top_k, self.repetition_penalty
        if t is not None and not (math.isfinite(t) and t >= 0):
            raise BadRequest(f"temperature must be a finite number, 0 or more, got {t}")
        if p is not None and not 0 < p <= 1:
            raise BadRequest(f"top-p must be in (0, 1], got {p}")
        if k is not None and not (type(k) is int and 0 <= k <= MAX_TOP_K):
            raise BadRequest(f"top-k must be a whole number from 0 (off) to {MAX_TOP_K:,}, "
                             f"got {_short(k)}")
        if r is not None and not (math.isfinite(r) and r > 0):
            raise BadRequest(f"repetition penalty must be a finite number above 0, got {r}")
        if self.seed is not None and not (type(self.seed) is int and 0 <= self.seed <= MAX_SEED):
            raise BadRequest(f"seed must be a whole number from 0 to 2**64 - 1, "
                             f"got {_short(self.seed)}")


MAX_TOP_K = 2**31 - 1  # torch.topk takes an int32-sized k; any k past the vocab means "off"
MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed's range, less the negative half


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
    tensor_parallel: int = 1  # GPUs the model is cut across (parallel/session.py); 1: one device
    lm_head: str = "16bit"  # "int8" / "int4": a quantized copy of the lm_head (quant/lm_head.py)

    def validate(self) -> None:
        for name in ("model", "draft"):
            path = getattr(self, name) or ""
            if "\0" in path:
                raise BadRequest(f"the {name} path holds a NUL character, so no folder has it")
            if len(path) > MAX_PATH_CHARS:  # the OS would refuse it with an error, not an answer
                raise BadRequest(f"the {name} path is longer than {MAX_PATH_CHARS:,} characters")
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
        # what parallel/sharded_step.py cuts and parallel/follower.py caches today: 16-bit weights
        # and KV
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
MAX_PATH_CHARS = 4096  # Linux's PATH_MAX


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
        if any(i < 0 for i in self.prompt_ids or ()):
            raise BadRequest("prompt_ids must be token ids, 0 or more")
        for i, m in enumerate(self.messages or ()):
            if not isinstance(m, dict) or not isinstance(m.get("content"), str) or m.get(
                "role"
            ) not in ("system", "user", "assistant"):
                raise BadRequest(
                    f"messages[{i}] must be an object with a role (system, user or assistant) "
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


MAX_NESTING = 32  # a message is 3 levels deep; json itself gives up near 1,000 (RecursionError)


def request_from_json(line: str | bytes):
    """Parse one command line, whatever it holds; raises BadRequest with a one-sentence reason
    that names the field at fault. Field types are checked here (a JSON command is taken as
    sent: 1.5 is no top_k, "5" no context); the values' ranges are `validate()`'s business."""
    if isinstance(line, (bytes, bytearray)):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BadRequest(f"command is not valid UTF-8 (byte {e.object[e.start]:#04x} at "
                             f"offset {e.start})") from None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise BadRequest(f"command is not valid JSON: {e.msg}") from None
    except RecursionError:
        raise BadRequest("command is nested too deeply to read") from None
    except ValueError:  # JSON is fine but Python refuses the integer: over 4,300 digits
        raise BadRequest("command holds a number with too many digits") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("command"), str) or (
            obj["command"] not in REQUESTS):
        raise BadRequest(f"unknown command; expected an object whose \"command\" is one of "
                         f"{', '.join(REQUESTS)}")
    cls = REQUESTS[obj.pop("command")]
    _check_text_and_depth(obj, cls.command)
    return _build(cls, obj, cls.command, "")


def _build(cls, obj: dict, command: str, prefix: str):
    kinds = _FIELD_KINDS[cls]
    unknown = set(obj) - set(kinds)
    if unknown:
        names = ", ".join(sorted(_short(n) for n in unknown)[:5])
        raise BadRequest(f"unknown field(s) for {command}: {names}")
    args = {name: _convert(command, prefix + name, *kinds[name], value)
            for name, value in obj.items()}
    try:
        return cls(**args)
    except TypeError as e:  # unreachable with the checks above; kept as the contract's floor
        raise BadRequest(f"malformed {command} command: {e}") from None


def _convert(command: str, where: str, base: str, optional: bool, value):
    if value is None:
        if optional:
            return None
        if base in _NULL_IS_EMPTY:  # what older clients send for "none"
            return _NULL_IS_EMPTY[base]()
    elif base == "SamplingParams":
        if isinstance(value, dict):
            return _build(SamplingParams, value, command, "sampling.")
    else:
        ok, convert, _ = _KINDS[base]
        if ok(value):
            return convert(value)
    wanted = "an object" if base == "SamplingParams" else _KINDS[base][2]
    raise BadRequest(f"{command} field {where!r} must be {wanted}{' or null' * optional}, "
                     f"got {_describe(value)}")


def _is_int(v) -> bool:
    return type(v) is int and abs(v) <= 2**64  # not bool, not 2.0; no 4,000-digit counts


def _is_number(v) -> bool:
    if type(v) is int:
        return abs(v) <= 2**64  # a float of it is finite
    return type(v) is float and math.isfinite(v)  # json reads NaN and Infinity too


def _list_of(ok):
    return lambda v: isinstance(v, list) and all(ok(x) for x in v)


_KINDS = {  # annotation -> (accepts the JSON value, converts it, what it must be)
    "str": (lambda v: isinstance(v, str), str, "a string"),
    "int": (_is_int, int, "a whole number of at most 20 digits"),
    "float": (_is_number, float, "a finite number"),
    "bool": (lambda v: type(v) is bool, bool, "true or false"),
    "tuple[str, ...]": (_list_of(lambda v: isinstance(v, str)), tuple, "a list of strings"),
    "tuple[int, ...]": (_list_of(_is_int), tuple, "a list of whole numbers"),
    "tuple[dict, ...]": (_list_of(lambda v: isinstance(v, dict)), tuple, "a list of objects"),
}
_NULL_IS_EMPTY = {"tuple[str, ...]": tuple, "SamplingParams": SamplingParams}


def _field_kinds(cls) -> dict[str, tuple[str, bool]]:
    """name -> (base annotation, optional), from the dataclass's own (string) annotations."""
    kinds = {}
    for f in dataclasses.fields(cls):
        parts = [p.strip() for p in str(f.type).split("|")]
        base = [p for p in parts if p != "None"]
        if len(base) != 1 or (base[0] not in _KINDS and base[0] != "SamplingParams"):
            raise TypeError(f"{cls.__name__}.{f.name}: no JSON check for {f.type!r}")
        kinds[f.name] = (base[0], "None" in parts)
    return kinds


_FIELD_KINDS = {cls: _field_kinds(cls) for cls in (*REQUESTS.values(), SamplingParams)}


def _describe(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        text = _short(v)
        return text if text.startswith("a ") else f"the number {text}"
    if isinstance(v, str):
        return f"the string {_short(v)}"
    return "a list" if isinstance(v, list) else "an object"


def _short(v, limit: int = 40) -> str:
    """repr for a message: short, ASCII (a hostile value must not make the answer huge)."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**limit:
        return f"a {len(str(abs(v)))}-digit number"
    text = ascii(v)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _check_text_and_depth(obj: dict, command: str) -> None:
    """Refuse lone surrogates (JSON escapes can carry them; no tokenizer or pipe takes them) and
    nesting past MAX_NESTING, naming the field; iterative, so depth cannot overflow the stack."""
    stack = [(v, str(k), 1) for k, v in obj.items()] + [(k, str(k), 1) for k in obj]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_NESTING:
            raise BadRequest(f"{command} field {_short(where)} is nested more than "
                             f"{MAX_NESTING} levels deep")
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequest(f"{command} field {_short(where)} holds a lone surrogate "
                                 "(\\ud800-\\udfff), which is not text") from None
        elif isinstance(value, list):
            stack.extend((v, where, depth + 1) for v in value)
        elif isinstance(value, dict):
            stack.extend((v, where, depth + 1) for v in value.values())
            stack.extend((k, where, depth + 1) for k in value)


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
    body = {"event": ev.name, **dataclasses.asdict(ev)}
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
    return cls(**obj)
