"""The log probabilities a request asked for, step by step: of the chosen token and of the
likeliest ones, taken from the model's raw logits of that step (log_softmax before any penalty,
bias, temperature, top-k or top-p: what OpenAI and vLLM report by default). Both generation
loops take them from here through the request's Sampler, so they are the same alone or in a
batch. Recorded on the device with no host sync; read when the token is given out."""

from __future__ import annotations

from collections import deque

import torch

from engine.events import Token

# one reported token: (its logprob, ((id, logprob) of the likeliest tokens, most likely first))
TokenLogprob = tuple[float, tuple[tuple[int, float], ...]]


class LogprobRecorder:
    """The records of the tokens chosen so far and not yet read, oldest first."""

    def __init__(self, num_top: int, device: torch.device):
        self.num_top = num_top
        self.pinned = device.type == "cuda"
        self._pending: deque = deque()

    def record(self, logits: torch.Tensor, token: torch.Tensor) -> None:
        """logits [V]: the step's raw logits; token [1]: the id chosen from them."""
        logprobs = logits.float().log_softmax(-1)
        top = logprobs.topk(self.num_top) if self.num_top else None
        parts = [logprobs[token]]
        if top is not None:  # ids as floats: exact below 2**24, far past any vocabulary
            parts += [top.values, top.indices.float()]
        row = torch.cat(parts)
        if self.pinned:  # copied while later steps run; read once that copy is done
            host = torch.empty(row.shape, dtype=row.dtype, pin_memory=True)
            host.copy_(row, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            self._pending.append((host, done))
        else:
            self._pending.append((row, None))

    def take(self, n: int) -> tuple[TokenLogprob, ...]:
        """The records of the n oldest tokens not yet read."""
        out = []
        for _ in range(n):
            row, done = self._pending.popleft()
            if done is not None:
                done.synchronize()
            values = row.tolist()
            k = self.num_top
            out.append((values[0], tuple(zip((int(i) for i in values[1 + k:]), values[1:1 + k],
                                             strict=True))))
        return tuple(out)


def token_event(text: str, ids, recorder: LogprobRecorder | None) -> Token:
    """The Token event of `ids`, with their logprobs where the request asked for them."""
    if recorder is None or not ids:
        return Token(text, tuple(ids))
    return Token(text, tuple(ids), recorder.take(len(ids)))
