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
        """logits [V]: the step's raw logits; token [1]: the id chosen from them. Or a verify
        pass's: logits [n, V] of n positions, token [n] the ids kept there, one record each."""
        logprobs = logits.float().reshape(-1, logits.shape[-1]).log_softmax(-1)
        token = token.reshape(-1, 1)
        top = logprobs.topk(self.num_top) if self.num_top else None
        parts = [logprobs.gather(1, token)]
        if top is not None:  # ids as floats: exact below 2**24, far past any vocabulary
            parts += [top.values, top.indices.float()]
        rows = torch.cat(parts, dim=1)
        done = None
        if self.pinned:  # copied while later steps run; read once that copy is done
            host = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
            host.copy_(rows, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            rows = host
        self._pending.extend((row, done) for row in rows)

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
