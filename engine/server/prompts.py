"""A chat or completion request as the engine's GenerateRequests, one per choice, with every
check that can fail made first: refused options, the prompt against the context (never
truncated), max_tokens against what is left of it. Each failure is a 400 naming its parameter.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from engine.answer import tool_request
from engine.answer.reader import Reading
from engine.answer.reasoning import opens_thinking
from engine.events import BadRequest, GenerateRequest, GrammarSpec, SamplingParams
from engine.events.requests import MAX_LOGIT_BIAS, MAX_SEED, short_repr
from engine.grammar import compiled, response_format, tool_calls
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
    reading: Reading = Reading()  # how a chat answer's text is read (engine/answer)


def _text(value: str, param: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"{param} is not valid Unicode text (a lone surrogate such as "
                          "\\ud800)", param) from None
    return value


def _refuse_unsupported(body) -> None:
    if body.stream_options is not None and not body.stream:
        raise bad_request("stream_options is only allowed with stream: true", "stream_options")


def _logit_bias(body, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias, {"token id": bias}: ids in the vocabulary, biases in [-100, 100]."""
    bias = body.logit_bias or {}
    if len(bias) > MAX_LOGIT_BIAS:
        raise bad_request(f"logit_bias takes at most {MAX_LOGIT_BIAS} tokens, got {len(bias)}",
                          "logit_bias")
    pairs = []
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit() and int(key) < vocab_size):
            raise bad_request(f"logit_bias keys are token ids from 0 to {vocab_size - 1}, got "
                              f"{short_repr(key)}", "logit_bias")
        if not -100 <= value <= 100:
            raise bad_request(f"logit_bias values are from -100 to 100, got {value}",
                              "logit_bias")
        pairs.append((int(key), float(value)))
    return tuple(pairs)


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


def _choices(body, prompts: list[list[int]], max_new: list[int], vocab_size: int,
             logprobs: int | None, grammar: GrammarSpec | None = None) -> list[Choice]:
    """`logprobs`: the top tokens reported beside each chosen one; None: no logprobs."""
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
    openai_options = {"presence_penalty": body.presence_penalty or 0.0,
                      "frequency_penalty": body.frequency_penalty or 0.0,
                      "logit_bias": _logit_bias(body, vocab_size), "logprobs": logprobs}
    for p, ids in enumerate(prompts):
        for i in range(n):
            # n choices of one seeded request differ from each other and repeat as a whole; a
            # negative seed wraps into the engine's range, as its two's complement
            seed = None if body.seed is None else (body.seed + i) % (MAX_SEED + 1)
            sampling = SamplingParams(body.temperature, top_p, top_k, body.repetition_penalty,
                                      seed, **openai_options)
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


async def _call_grammar(tools, reading: Reading, model: ModelView) -> GrammarSpec | None:
    """The grammar that holds the answer to tool_choice (engine/grammar/tool_calls.py),
    compiled here as response_format's is: a 400 naming tools where a schema does not compile."""

    def made() -> GrammarSpec | None:
        spec = tool_calls.call_grammar(
            tools, reading.syntax, lambda text: compiled.special_token(
                model.tok, model.vocab_size, text),
            reading.thinks, reading.thinking_open)
        if spec is not None:
            compiled.compile(model.tok, model.vocab_size, spec)
        return spec

    try:
        return await model.run(made)
    except BadRequest as e:
        raise bad_request(f"tools: {e}", "tools") from None


def _messages(body: ChatCompletionRequest) -> list[dict]:
    out = []
    for i, m in enumerate(body.messages):
        role = "system" if m.role == "developer" else m.role
        if role not in ("system", "user", "assistant", "tool"):
            raise bad_request(f"messages[{i}].role {m.role[:40]!r} is not supported: use system, "
                              "developer, user, assistant or tool", f"messages[{i}].role")
        content = m.content
        extra = {}
        if role == "assistant" and m.tool_calls:
            # content null beside calls: left out, as apply_chat_template drops None keys
            extra["tool_calls"] = tool_request.assistant_calls(m.tool_calls, i)
        if role == "assistant" and m.reasoning_content is not None:
            extra["reasoning_content"] = _text(m.reasoning_content,
                                               f"messages[{i}].reasoning_content")
        if role == "tool":
            extra.update({k: v for k, v in (("tool_call_id", m.tool_call_id),
                                            ("name", m.name)) if v is not None})
        if content is None and "tool_calls" in extra:
            out.append({"role": role, "content": None, **extra})
            continue
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
        out.append({"role": role, "content": _text(content, f"messages[{i}].content"), **extra})
    return out


async def chat_choices(body: ChatCompletionRequest, model: ModelView) -> list[Choice]:
    _refuse_unsupported(body)
    if body.top_logprobs is not None and not body.logprobs:
        raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
    grammar = await _grammar(body.response_format, model)
    try:
        tools = tool_request.tool_use(body.tools, body.tool_choice, body.parallel_tool_calls)
        extra = tool_request.template_kwargs(body.chat_template_kwargs)
        messages = _messages(body)
    except tool_request.RequestError as e:
        raise bad_request(str(e), e.param) from None
    messages = tool_request.fit_call_ids(messages, model.tool_syntax.id_length)
    if not model.renders_calls:
        messages = tool_request.calls_as_text(messages)
    if tools is not None:
        messages = tool_request.with_instruction(messages, tools.instruction())
        if tools.template_tools() is not None:
            extra["tools"] = tools.template_tools()
    try:
        ids, text = await model.chat_prompt(messages, extra)
    except BadRequest as e:
        raise bad_request(str(e), "messages") from None
    if body.max_completion_tokens is not None:
        asked, param = body.max_completion_tokens, "max_completion_tokens"
    else:
        asked, param = body.max_tokens, "max_tokens"
    max_new = _max_new(asked, param, len(ids), model.context, "messages")
    calls = tools is not None and tools.choice != "none"
    reading = Reading(syntax=model.tool_syntax if calls else None, thinks=model.thinks,
                      thinking_open=model.thinks and opens_thinking(text),
                      max_calls=None if tools is None or tools.parallel else 1,
                      must_call=(tools.function or "") if calls and tools.must_call else None)
    # the calls' grammar holds the answer, but under auto a response_format's holds it alone
    if calls and (tools.must_call or grammar is None):
        grammar = await _call_grammar(tools, reading, model)
    return [replace(c, reading=reading) for c in _choices(
        body, [ids], [max_new], model.vocab_size,
        (body.top_logprobs or 0) if body.logprobs else None, grammar)]


def _prompt_list(prompt) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    return list(prompt)


async def completion_choices(body: CompletionRequest, model: ModelView) -> list[Choice]:
    _refuse_unsupported(body)
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
    return _choices(body, all_ids, max_new, model.vocab_size, body.logprobs, grammar)
