"""A chat or completion request as the engine's GenerateRequests, one per choice, with every
check that can fail made first: refused options, the prompt against the context (never
truncated), max_tokens against what is left of it. Each failure is a 400 naming its parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.events import BadRequest, GenerateRequest, GrammarSpec, SamplingParams
from engine.events.requests import MAX_SEED
from engine.grammar import compiled, response_format
from engine.server.errors import bad_request
from engine.server.model_view import ModelView
from engine.server.wire import (
    COMPLETION_MAX_TOKENS,
    MAX_CHOICES,
    MAX_STOP_STRINGS,
    MIN_SEED,
    ChatCompletionRequest,
    CompletionRequest,
)


@dataclass(frozen=True)
class Choice:
    index: int
    request: GenerateRequest
    prompt_tokens: int


def _text(value: str, param: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"{param} is not valid Unicode text (a lone surrogate such as "
                          "\\ud800)", param) from None
    return value


def _refuse_unsupported(body) -> None:
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(body, name):
            raise bad_request(f"{name} is not supported by this server; leave it out or send 0 "
                              "(repetition_penalty is)", name)
    if body.logit_bias:
        raise bad_request("logit_bias is not supported by this server", "logit_bias")
    if body.stream_options is not None and not body.stream:
        raise bad_request("stream_options is only allowed with stream: true", "stream_options")


def _stops(stop) -> tuple[str, ...]:
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if len(stops) > MAX_STOP_STRINGS:
        raise bad_request(f"stop takes at most {MAX_STOP_STRINGS} strings, got {len(stops)}",
                          "stop")
    if any(not s for s in stops):
        raise bad_request("stop strings must not be empty", "stop")
    return tuple(_text(s, "stop") for s in stops)


def _max_new(asked: int | None, param: str, num_prompt: int, context: int, where: str) -> int:
    if num_prompt >= context:
        raise bad_request(f"This model's maximum context length is {context} tokens, but the "
                          f"{where} hold {num_prompt} tokens; shorten them", where,
                          "context_length_exceeded")
    if asked is None:
        return context - num_prompt
    if asked < 1:
        raise bad_request(f"{param} must be at least 1, got {asked}", param)
    if num_prompt + asked > context:
        raise bad_request(f"This model's maximum context length is {context} tokens. However, "
                          f"you requested {num_prompt + asked} tokens ({num_prompt} in the "
                          f"{where}, {asked} in the completion); reduce {where} or {param}",
                          param, "context_length_exceeded")
    return asked


def _choices(body, prompts: list[list[int]], max_new: list[int],
             grammar: GrammarSpec | None = None) -> list[Choice]:
    n = body.n or 1
    if len(prompts) * n > MAX_CHOICES:
        raise bad_request(f"at most {MAX_CHOICES} choices a request (prompts times n), got "
                          f"{len(prompts) * n}", "n")
    if body.seed is not None and not MIN_SEED <= body.seed <= MAX_SEED:
        raise bad_request("seed must be a whole number from -2**63 to 2**64 - 1", "seed")
    # top_p 0 is in OpenAI's range: the smallest nucleus, the most likely token alone, which
    # top_k 1 keeps (the engine's top-p is above 0)
    top_p, top_k = (None, 1) if body.top_p == 0 else (body.top_p, body.top_k)
    choices = []
    stop = _stops(body.stop)
    for p, ids in enumerate(prompts):
        for i in range(n):
            # n choices of one seeded request differ from each other and repeat as a whole; a
            # negative seed wraps into the engine's range, as its two's complement
            seed = None if body.seed is None else (body.seed + i) % (MAX_SEED + 1)
            sampling = SamplingParams(body.temperature, top_p, top_k, body.repetition_penalty,
                                      seed)
            req = GenerateRequest(prompt_ids=tuple(ids), max_new_tokens=max_new[p], stop=stop,
                                  sampling=sampling, ignore_eos=body.ignore_eos,
                                  stop_on_repetition=body.stop_on_repetition,
                                  grammar=grammar)
            try:
                req.validate()
            except BadRequest as e:
                raise bad_request(str(e)) from None
            choices.append(Choice(len(choices), req, len(ids)))
    return choices


async def _grammar(fmt: dict | None, model: ModelView) -> GrammarSpec | None:
    """response_format's grammar, compiled here on the tokenizer's thread (the engine finds it
    cached): a 400 with the reason where it cannot be."""
    try:
        spec = response_format.spec_of(fmt)
        if spec is not None:
            await model.run(compiled.compile, model.tok, model.vocab_size, spec)
    except BadRequest as e:
        raise bad_request(str(e), "response_format") from None
    return spec


def _messages(body: ChatCompletionRequest) -> list[dict]:
    out = []
    for i, m in enumerate(body.messages):
        role = "system" if m.role == "developer" else m.role
        if role not in ("system", "user", "assistant"):
            raise bad_request(f"messages[{i}].role {m.role[:40]!r} is not supported: use system, "
                              "developer, user or assistant (this server has no tool calling)",
                              f"messages[{i}].role")
        content = m.content
        if content is None:
            raise bad_request(f"messages[{i}].content is missing", f"messages[{i}].content")
        if not isinstance(content, str):
            texts = []
            for j, part in enumerate(content):
                if part.type != "text" or part.text is None:
                    raise bad_request(f"messages[{i}].content[{j}] is a {part.type[:40]!r} "
                                      "part; this model reads text parts only",
                                      f"messages[{i}].content")
                texts.append(part.text)
            content = "\n".join(texts)
        out.append({"role": role, "content": _text(content, f"messages[{i}].content")})
    return out


async def chat_choices(body: ChatCompletionRequest, model: ModelView) -> list[Choice]:
    _refuse_unsupported(body)
    if body.logprobs or body.top_logprobs:
        raise bad_request("logprobs are not available from this server yet",
                          "logprobs" if body.logprobs else "top_logprobs")
    if body.tools:
        raise bad_request("tools are not supported by this server", "tools")
    grammar = await _grammar(body.response_format, model)
    messages = _messages(body)
    try:
        ids = await model.chat_ids(messages)
    except BadRequest as e:
        raise bad_request(str(e), "messages") from None
    if body.max_completion_tokens is not None:
        asked, param = body.max_completion_tokens, "max_completion_tokens"
    else:
        asked, param = body.max_tokens, "max_tokens"
    max_new = _max_new(asked, param, len(ids), model.context, "messages")
    return _choices(body, [ids], [max_new], grammar)


def _prompt_list(prompt) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    return list(prompt)


async def completion_choices(body: CompletionRequest, model: ModelView) -> list[Choice]:
    _refuse_unsupported(body)
    if body.logprobs is not None:
        raise bad_request("logprobs are not available from this server yet", "logprobs")
    if body.echo:
        raise bad_request("echo is not supported by this server", "echo")
    if body.best_of is not None and body.best_of != (body.n or 1):
        raise bad_request("best_of is not supported by this server; leave it out", "best_of")
    grammar = await _grammar(body.response_format, model)
    prompts = _prompt_list(body.prompt)
    if not prompts or any(len(p) == 0 for p in prompts):
        raise bad_request("the prompt is empty", "prompt")
    fim = None
    if body.suffix is not None:
        fim = model.fim_tokens()
        if fim is None:
            raise bad_request("suffix needs a model with fill-in-the-middle tokens, and this "
                              "model's tokenizer has none", "suffix")
        if not all(isinstance(p, str) for p in prompts):
            raise bad_request("suffix takes a text prompt, not token ids", "suffix")
    all_ids = []
    for p in prompts:
        if isinstance(p, str):
            text = _text(p, "prompt")
            if fim is not None:  # prefix-suffix-middle order: the model writes the middle
                text = f"{fim[0]}{text}{fim[1]}{_text(body.suffix, 'suffix')}{fim[2]}"
            all_ids.append(await model.run(model.text_ids, text))
        else:
            if not all(0 <= t < model.vocab_size for t in p):
                raise bad_request(f"prompt holds a token id outside the vocabulary (0 to "
                                  f"{model.vocab_size - 1})", "prompt")
            all_ids.append(list(p))
    asked = COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens
    max_new = [_max_new(asked, "max_tokens", len(ids), model.context, "prompt")
               for ids in all_ids]
    return _choices(body, all_ids, max_new, grammar)
