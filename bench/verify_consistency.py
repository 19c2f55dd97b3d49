"""Do one-token steps and speculative verify blocks compute the same logits? Per decode-attention
backend, over one random-weight model: a plain greedy run of one-token steps, then the same
sequence teacher-forced through verify blocks of T tokens; reported: the positions whose argmax
differs, the largest relative logits difference, and the first position where they part.

Why: in the second speculative GPU run (docs/benchmark-log.md) the synthetic draft's acceptance fell
from 0.5-0.8 to 0.09-0.17 once the Triton kernel read bf16 caches (SDPA had before): the
synthetic draft proposes a one-token-step run's tokens, so any argmax a verify block decides
differently sends the sequence off that reference. This measures the suspected cause.
Usage (repository root): python3 bench/verify_consistency.py \\
    --model bench/qwen2.5-7b [--backends sdpa triton triton-per-pass] [--tokens 128]
    [--block 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.events import LoadRequest  # noqa: E402
from engine.generate.session import Session  # noqa: E402
from engine.kernels import attention_backend  # noqa: E402
from engine.load import loader
from engine.tools.bench.decode import _folder_for_random, _prompts  # noqa: E402


@torch.inference_mode()
def compare(session: Session, prompt: list[int], tokens: int, block: int) -> dict:
    dec, dev = session.decoder, session.lm.device
    ids = torch.tensor(prompt, device=dev)
    session.cache.crop(0)
    logits = dec.forward(ids, 0)
    seq, step_logits = list(prompt), []
    for _ in range(tokens):  # plain greedy: one-token steps
        nxt = int(logits.argmax())
        seq.append(nxt)
        logits = dec.step(torch.tensor([nxt], device=dev), len(seq) - 1)
        step_logits.append(logits.float().clone())
    # the same sequence through verify blocks: a block feeds seq[p..p+T-1] at positions
    # p..p+T-1; its row j is the logits after seq[p+j], as step_logits[p+j-P] was
    session.cache.crop(len(prompt))
    flips, worst, first = 0, 0.0, None
    p = len(prompt)  # seq[p] is the first generated token, fed at position p
    while p + block <= len(seq):
        out = dec.verify(torch.tensor(seq[p:p + block], device=dev), p).float()
        for j in range(block):
            ref = step_logits[p + j - len(prompt)]  # the step that fed seq[p + j]
            worst = max(worst, ((out[j] - ref).norm() / ref.norm()).item())
            if int(out[j].argmax()) != int(ref.argmax()):
                flips += 1
                first = p + j if first is None else first
        p += block
    checked = p - len(prompt)
    return dict(positions=checked, argmax_flips=flips, first_flip=first,
                max_rel_logits_diff=worst)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--quant", default="bf16")
    ap.add_argument("--backends", nargs="+", default=["sdpa", "triton", "triton-per-pass"])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--block", type=int, default=5)
    ap.add_argument("--prompt-len", type=int, default=512)
    a = ap.parse_args(argv)
    req = LoadRequest(model=a.model, quant=a.quant, device="auto",
                      context=a.prompt_len + a.tokens + 64)
    lm = loader.random_model(_folder_for_random(a.model), req)
    prompt = _prompts(1, a.prompt_len, lm.model.config.vocab_size, seed=0)[0]
    for how in a.backends:
        # "triton" fixes a row's arithmetic whatever shares its pass (the default since
        # 2026-11-29); "triton-per-pass" splits each pass's keys by its own end, as before
        os.environ[attention_backend.ENV] = how.removesuffix("-per-pass")
        os.environ[attention_backend.CONFIG_ENV] = (
            '{"consistent": false}' if how.endswith("-per-pass") else "")
        session = Session(lm, "auto")
        if session.decoder.mode == "graph":  # verify blocks replayed as graphs, as speculation does
            session.decoder.capture_blocks([a.block])
        row = dict(backend=how, decode_path=session.decoder.mode, block=a.block,
                   **compare(session, prompt, a.tokens, a.block))
        print(json.dumps(row), flush=True)
        session = None
    return 0


if __name__ == "__main__":
    sys.exit(main())
