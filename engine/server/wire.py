"""The request bodies of the OpenAI API that the server reads, as pydantic models (they also make
the OpenAPI schema). Only their shape is checked here; what a value means for this model (the
context, the chat template, a refused option) is checked in server/prompts.py.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MAX_CHOICES = 8  # n (times the prompts of a completion): submitted together, run in one batch
MAX_STOP_STRINGS = 4  # OpenAI's own bound
COMPLETION_MAX_TOKENS = 16  # OpenAI's default for completions, left out or null
MIN_SEED = -2**63  # OpenAI takes any int64


class _Body(BaseModel):
    # unknown fields are ignored, as OpenAI's own clients add new ones all the time; a NaN or inf
    # (Python's json reads them) is never a setting
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class ContentPart(_Body):
    type: str
    text: str | None = None


class ChatMessage(_Body):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message: the call it answers
    reasoning_content: str | None = None  # an assistant's earlier thinking (vLLM's field)


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    """What chat and completions share: sampling, stops, streaming, and refused options."""

    model: str
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    n: int | None = Field(1, ge=1, le=MAX_CHOICES)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # extensions vLLM and llama.cpp also accept
    top_k: int | None = Field(None, ge=0)
    repetition_penalty: float | None = Field(None, gt=0)
    ignore_eos: bool = False
    # Hearth's own: end an answer that repeats itself (finish_reason "stop"); off unless asked
    stop_on_repetition: bool = False


EXTENSIONS = ("repetition_penalty", "ignore_eos", "stop_on_repetition")


def extensions(body) -> dict:
    """The extensions another protocol's request carries, as a chat request's fields."""
    return {name: getattr(body, name) for name in EXTENSIONS}


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # passed to the chat template (vLLM's extension), e.g. {"enable_thinking": false}
    chat_template_kwargs: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None


class CompletionRequest(_Sampling):
    # a text, token ids, or several of either (each its own choice)
    prompt: str | list[str] | list[int] | list[list[int]]
    suffix: str | None = None
    max_tokens: int | None = COMPLETION_MAX_TOKENS
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool | None = False
    best_of: int | None = Field(None, ge=1, le=MAX_CHOICES)
    response_format: dict[str, Any] | None = None  # as chat's (grammar/response_format.py)
