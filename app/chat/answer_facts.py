"""The line of facts under an answer: tokens, tokens/s, time to first token, speculative
acceptance where it ran, and why it stopped, from the Stats kept with the message."""

from __future__ import annotations

from app.history.conversation import Message

STOP_REASONS = {
    "eos": "ended by the model",
    "stop_string": "ended at a stop string",
    "max_tokens": "cut at the answer's token limit",
    "repetition": "cut: it was repeating itself",
    "cancelled": "stopped by you",
}


def facts_text(message: Message) -> str:
    """"" while an answer streams, and for one without stats (an old or failed one)."""
    s = message.stats
    if message.status == "streaming" or s is None:
        return ""
    parts = [f"{s.new_tokens:,} tokens"]
    if s.decode_tokens_per_s:
        parts.append(f"{s.decode_tokens_per_s:.1f} tokens/s")
    if s.ttft_ms:
        parts.append(f"first token {_ms(s.ttft_ms)}")
    if s.proposed_draft_tokens:
        how = "prompt lookup" if s.speculation == "prompt_lookup" else "draft"
        parts.append(f"{how} acceptance "
                     f"{s.accepted_draft_tokens / s.proposed_draft_tokens:.0%}")
    reason = STOP_REASONS.get(message.finish_reason or "")
    if reason:
        parts.append(reason)
    return " · ".join(parts)


def _ms(ms: float) -> str:
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.1f} s"
