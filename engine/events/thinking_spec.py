"""How a chat request treats the thinking of a model that thinks (`<think>...</think>`: Qwen3, the
DeepSeek-R1 distills): where a request carries one, the thinking comes apart from the answer, in
Token.reasoning (engine/answer/reasoning.py reads it), and `enabled` goes to the chat template as
its enable_thinking (None: the template's default). Pure data; the window's Think toggle makes
one."""

from __future__ import annotations

from dataclasses import dataclass

from engine.events.requests import BadRequest, short_repr


@dataclass(frozen=True)
class ThinkingSpec:
    enabled: bool | None = None

    def validate(self) -> None:
        if self.enabled is not None and type(self.enabled) is not bool:
            raise BadRequest(f"thinking.enabled is true, false or null, not "
                             f"{short_repr(self.enabled)}")

    def template_kwargs(self) -> dict:
        """What the chat template receives: enable_thinking where it is set."""
        return {} if self.enabled is None else {"enable_thinking": self.enabled}
