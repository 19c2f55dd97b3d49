"""The requests the app sends the engine (load, generate, cancel, unload, shutdown) and the checks
of their values. Pure data (no torch); their JSON form is events/request_json.py.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from engine.formats import kv_dtypes, weights

if TYPE_CHECKING:
    from engine.events.grammar_spec import GrammarSpec


class BadRequest(ValueError):
    """A request that can never succeed as written: one sentence, shown to the user as is."""


def quant_choices() -> tuple[str, ...]:
    """--quant's words: auto, then every weight format (read at each call: a format registered
    after import counts)."""
    return ("auto", *weights.names())


def kv_dtype_choices() -> tuple[str, ...]:
    """--kv-dtype's words: auto, then every KV dtype (read at each call, as quant_choices)."""
    return ("auto", *kv_dtypes.names())


LM_HEADS = ("16bit", "int8", "int4")


@dataclass(frozen=True)
class SamplingParams:
    """None means: take the model's generation_config.json default, else the engine's."""

    temperature: float | None = None  # 0 is greedy
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    # OpenAI's penalties over the generated tokens, its logit_bias as (token id, bias) pairs,
    # and how many of the likeliest tokens to report beside each chosen one (None: no logprobs)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None

    def validate(self) -> None:
        # `not (...)` so that NaN fails too; inf is no temperature or penalty a sampler can use
        t, p, k, r = self.temperature, self.top_p, self.top_k, self.repetition_penalty
        if t is not None and not (math.isfinite(t) and t >= 0):
            raise BadRequest(f"temperature must be a finite number, 0 or more, got {t}")
        if p is not None and not 0 < p <= 1:
            raise BadRequest(f"top-p must be in (0, 1], got {p}")
        if k is not None and not (type(k) is int and 0 <= k <= MAX_TOP_K):
            raise BadRequest(f"top-k must be a whole number from 0 (off) to {MAX_TOP_K:,}, "
                             f"got {short_repr(k)}")
        if r is not None and not (math.isfinite(r) and r > 0):
            raise BadRequest(f"repetition penalty must be a finite number above 0, got {r}")
        if self.seed is not None and not (type(self.seed) is int and 0 <= self.seed <= MAX_SEED):
            raise BadRequest(f"seed must be a whole number from 0 to 2**64 - 1, "
                             f"got {short_repr(self.seed)}")
        check_openai_sampling(self)


def check_openai_sampling(s: SamplingParams) -> None:
    """The options OpenAI's API adds: penalties in [-2, 2], a bounded logit_bias of [-100, 100]
    per token (ids past the vocabulary are the Session's check), 0 to MAX_LOGPROBS logprobs."""
    for name in ("presence_penalty", "frequency_penalty"):
        v = getattr(s, name)
        if not (type(v) in (int, float) and math.isfinite(v) and -2 <= v <= 2):
            raise BadRequest(f"{name.replace('_', ' ')} must be from -2 to 2, got {v}")
    if len(s.logit_bias) > MAX_LOGIT_BIAS:
        raise BadRequest(f"logit_bias takes at most {MAX_LOGIT_BIAS} tokens, got "
                         f"{len(s.logit_bias)}")
    for pair in s.logit_bias:
        if not (isinstance(pair, tuple) and len(pair) == 2 and type(pair[0]) is int
                and pair[0] >= 0 and type(pair[1]) in (int, float) and math.isfinite(pair[1])
                and -100 <= pair[1] <= 100):
            raise BadRequest(f"logit_bias maps token ids (0 or more) to biases from -100 to 100, "
                             f"got {short_repr(pair)}")
    if s.logprobs is not None and not (type(s.logprobs) is int
                                       and 0 <= s.logprobs <= MAX_LOGPROBS):
        raise BadRequest(f"logprobs takes 0 to {MAX_LOGPROBS} top tokens, got "
                         f"{short_repr(s.logprobs)}")


MAX_LOGIT_BIAS = 300  # OpenAI's own bound on logit_bias entries
MAX_LOGPROBS = 20  # top_logprobs' range on chat completions (completions take 5)
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
    # greedy answers that do not change with how they were computed (models/invariant.py);
    # None: this device's default (generate/session_load.py reproducible_for)
    reproducible: bool | None = None
    # tokens the KV arena holds for every sequence together (continuous batching shares it);
    # None: one context's worth
    kv_tokens: int | None = None

    def validate(self) -> None:
        for name in ("model", "draft"):
            path = getattr(self, name) or ""
            if "\0" in path:
                raise BadRequest(f"the {name} path holds a NUL character, so no folder has it")
            if len(path) > MAX_PATH_CHARS:  # the OS would refuse it with an error, not an answer
                raise BadRequest(f"the {name} path is longer than {MAX_PATH_CHARS:,} characters")
        quants, kv_choices = quant_choices(), kv_dtype_choices()
        if self.quant not in quants:
            raise BadRequest(f"unknown --quant {self.quant!r}; choose one of {', '.join(quants)}")
        if self.kv_dtype not in kv_choices:
            raise BadRequest(
                f"unknown --kv-dtype {self.kv_dtype!r}; choose one of {', '.join(kv_choices)}"
            )
        if self.device not in ("auto", "cuda", "cpu"):
            raise BadRequest(f"unknown --device {self.device!r}; choose auto, cuda or cpu")
        if self.context is not None and self.context < 16:
            raise BadRequest(f"context must be at least 16 tokens, got {self.context}")
        if self.kv_tokens is not None and (type(self.kv_tokens) is not int
                                           or self.kv_tokens < 16):
            raise BadRequest(f"kv_tokens is a whole number of tokens, at least 16, not "
                             f"{self.kv_tokens!r}")
        if self.memory_limit_gib is not None and not self.memory_limit_gib > 0:
            raise BadRequest(f"memory limit must be above 0 GiB, got {self.memory_limit_gib}")
        _check_speculative_tokens(self.num_speculative_tokens, minimum=1)
        if self.lm_head not in LM_HEADS:
            raise BadRequest(f"unknown --lm-head {self.lm_head!r}; choose one of "
                             f"{', '.join(LM_HEADS)}")
        if self.reproducible is not None and type(self.reproducible) is not bool:  # not 1, not "on"
            raise BadRequest(f"reproducible is true, false or null, not {self.reproducible!r}")
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
        if self.quant != "auto" and not weights.get(self.quant).tensor_parallel:
            raise BadRequest(f"--tensor-parallel cuts 16-bit weights only so far; use --quant "
                             f"bf16 or auto, not {self.quant}")
        if self.kv_dtype in kv_dtypes.quantized():
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


@dataclass(frozen=True)
class GenerateRequest:
    """Exactly one of `prompt`, `messages` or `prompt_ids` (token ids, sent as they are).

    `raw` tokenizes the prompt as is, no template. `ignore_eos` (benchmarks) runs to max tokens.
    `stop_on_repetition` ends an answer that repeats itself (generate/loop_guard.py) with the
    finish reason "repetition": the window, `hearth chat` and `hearth run` ask for it; the
    server's API only where its request does (a client may want the tokens as they come).
    Speculation: a session loaded with a draft uses it; `prompt_lookup` proposes from n-gram
    matches in the conversation instead; `num_speculative_tokens` fixes K for this request
    (None: the session's choice, adaptive unless fixed at load; 0: no speculation).
    """

    command: ClassVar[str] = "generate"
    id: str | None = None  # the worker tags this request's events with it; a cancel can name it
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
    stop_on_repetition: bool = False
    grammar: GrammarSpec | None = None  # the answer's form (events/grammar_spec.py)

    def validate(self) -> None:
        if self.grammar is not None:
            self.grammar.validate()
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
        check_request_id(self.id)


MAX_REQUEST_ID_CHARS = 64


def check_request_id(request_id: str | None) -> None:
    """An id is echoed in every event line of its request: short printable ASCII."""
    if request_id is None:
        return
    if not (0 < len(request_id) <= MAX_REQUEST_ID_CHARS and request_id.isascii()
            and request_id.isprintable()):
        raise BadRequest(f"a request id must be 1 to {MAX_REQUEST_ID_CHARS} printable ASCII "
                         f"characters, got {short_repr(request_id)}")


@dataclass(frozen=True)
class CancelRequest:
    command: ClassVar[str] = "cancel"
    id: str | None = None  # the generation to stop; None: every queued and running one

    def validate(self) -> None:
        check_request_id(self.id)


@dataclass(frozen=True)
class ServeRequest:
    """Start the OpenAI-compatible server inside the worker, on the worker's own model; port 0
    takes a free one (the `serving` event says which). `keep`: it outlives the window."""

    command: ClassVar[str] = "serve"
    id: str | None = None  # tags this command's Failed, told apart from a generation's
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    keep: bool = False

    def validate(self) -> None:
        check_request_id(self.id)
        if not 0 < len(self.host) <= 253 or not self.host.isascii() or any(
                c.isspace() or c in "/@?#" for c in self.host):
            raise BadRequest(f"the server's host must be an address or a host name, got "
                             f"{short_repr(self.host)}")
        if not 0 <= self.port <= 65535:
            raise BadRequest(f"the server's port must be 0 to 65535, got {self.port}")
        if self.api_key is not None and not self.api_key.strip():
            raise BadRequest("the server's API key must not be empty")
        if not is_loopback(self.host) and self.api_key is None:
            raise BadRequest(f"refusing to serve on {self.host} without an API key: anyone on "
                             "the network could use the model; set a key or use 127.0.0.1")


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost: reachable from this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServeStopRequest:
    """Stop the worker's server; generations of its clients end as cancelled."""

    command: ClassVar[str] = "serve_stop"


@dataclass(frozen=True)
class UnloadRequest:
    command: ClassVar[str] = "unload"


@dataclass(frozen=True)
class ShutdownRequest:
    command: ClassVar[str] = "shutdown"


REQUESTS = {c.command: c for c in (LoadRequest, GenerateRequest, CancelRequest, UnloadRequest,
                                   ShutdownRequest, ServeRequest, ServeStopRequest)}


def short_repr(v, limit: int = 40) -> str:
    """repr for a message: short, ASCII (a hostile value must not make the answer huge)."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**limit:
        return f"a {len(str(abs(v)))}-digit number"
    text = ascii(v)
    return text if len(text) <= limit else text[:limit - 3] + "..."
