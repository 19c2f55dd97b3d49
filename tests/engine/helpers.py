"""Shared helpers for engine tests: the transformers reference and event collection."""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.events import Finished, GenerateRequest, SamplingParams, Token, event_from_json
from engine.platform.device_timing import captured  # noqa: F401 - the GPU tests' name for it

PROMPT = "The quick brown fox explains the zipfile module"
REPO = Path(__file__).resolve().parents[2]


def _triton_version() -> tuple[int, int]:
    if importlib.util.find_spec("triton") is None:
        return (0, 0)
    major, minor, *_ = importlib.metadata.version("triton").split(".")
    return int(major), int(minor)


# Triton's CPU interpreter runs the kernels where no GPU is; 3.6's cannot take
# a loop bound reduced from a loaded tensor (seen on the device, 2026-11-29), 3.9's can. On a GPU
# the compiled kernel is tested against the same reference (test_quantized_kv).
INTERPRETER = pytest.mark.skipif(_triton_version() < (3, 9),
                                 reason="needs Triton's interpreter at 3.9 or later")


def interpreted(code: str, *args: str) -> None:
    """Run `code` (which prints "ok" at its end) in a process of its own under Triton's CPU
    interpreter (TRITON_INTERPRET is read when Triton is imported); assert that it got there."""
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))))
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


@contextlib.contextmanager
def through_the_kernel():
    """Every decode attention chosen as the Triton kernel (after a load: no load check), for
    scripts run by `interpreted`; yields the (path, query tokens) of each attention call."""
    from engine.attention import decode_attention
    from engine.cache.kv_cache import KVCache
    from engine.kernels import attention_backend

    calls: list[tuple[str, int]] = []
    kernel, choose = decode_attention.kernel, attention_backend.choose
    chosen = KVCache.decode_attention  # a cache keeps its choice from the load on

    def counted(q, kv, pos, kv_len, scaling, launch=None):
        calls.append(("triton", q.shape[2]))
        return kernel(q, kv, pos, kv_len, scaling, launch)

    decode_attention.kernel, attention_backend.choose = counted, lambda *args: "triton"
    KVCache.decode_attention = property(lambda self: "triton")
    try:
        yield calls
    finally:
        decode_attention.kernel, attention_backend.choose = kernel, choose
        KVCache.decode_attention = chosen


def hf_greedy(path: Path, prompt: str, max_new_tokens: int) -> list[int]:
    """transformers' own generate(), greedy: the reference the engine must equal."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    enc = tok(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, enc["input_ids"].shape[1]:].tolist()


def greedy_request(prompt: str = PROMPT, n: int = 64, **kw) -> GenerateRequest:
    return GenerateRequest(prompt=prompt, raw=True, max_new_tokens=n,
                           sampling=SamplingParams(temperature=0.0), **kw)


def token_ids(events) -> list[int]:
    return [i for e in events if isinstance(e, Token) for i in e.token_ids]


def text(events) -> str:
    return "".join(e.text for e in events if isinstance(e, Token))


def expected_cached(cache, ids: list[int]) -> int:
    """Prompt tokens a generation over `ids` should not prefill, worked out from the cache's
    state by hand: the live sequence's common prefix or the leading full blocks found by hash
    (another conversation's), whichever is longer; never the last token. The live sequence's
    full blocks are keyed first, as a generation does (a block keyed by an earlier
    conversation may hang from one of them)."""
    cache.blocks.commit(cache.seq, cache.token_ids)
    live = min(cache.reusable_prefix(ids), len(ids) - 1)
    return max(live, len(cache.blocks.cached_prefix(ids[:-1])) * cache.block_size)


def finished(events) -> Finished:
    assert isinstance(events[-1], Finished), events[-1]
    assert sum(isinstance(e, Finished) for e in events) == 1
    return events[-1]


class WorkerProcess:
    """A real `hearth worker` subprocess, spoken to in JSON lines."""

    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine.cli.worker"], cwd=REPO, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)

    def send(self, **command) -> None:
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def next_event(self):
        line = self.proc.stdout.readline()
        assert line, "the worker closed its stdout"
        return event_from_json(line)

    def stream(self, terminal=("finished", "failed", "loaded")) -> list:
        events = []
        while True:
            events.append(self.next_event())
            if events[-1].name in terminal:
                return events

    def close(self) -> int:
        self.send(command="shutdown")
        return self.proc.wait(timeout=30)



def verify_and_steps(session) -> tuple[torch.Tensor, torch.Tensor]:
    """The same 12 tokens after a 250-token prefill, through one verify block (crossing the
    256 bucket) and through single steps -> (block logits, step logits), both [12, V]."""
    ids = torch.randint(3, 2048, (262,), generator=torch.Generator().manual_seed(3))
    session.decoder.forward(ids[:250], 0)
    steps = torch.stack([session.decoder.step(ids[p:p + 1], p).clone() for p in range(250, 262)])
    return session.decoder.verify(ids[250:262], 250), steps


def answer_against_recompute(session, reference, req: GenerateRequest):
    """Generate `req` on `session` as it stands: its tokens must equal `reference`'s for the
    same prompt ids from an empty cache, and its stats' cached/computed split the cache's state
    before it. -> (prompt ids, reply text, the Finished stats)."""
    ids = session.prompt_ids(req)
    cached = expected_cached(session.cache, ids)
    events = list(session.generate(req))
    reference.cache.clear()
    cold = list(reference.generate(GenerateRequest(prompt_ids=tuple(ids),
                                                   max_new_tokens=req.max_new_tokens,
                                                   sampling=req.sampling)))
    assert token_ids(events) == token_ids(cold)
    stats = finished(events).stats
    assert (stats.cached_prompt_tokens, stats.computed_prompt_tokens) == (cached, len(ids) - cached)
    return ids, text(events), stats


def hearth_serve(*args: str) -> tuple[subprocess.Popen, str]:
    """`hearth serve --port 0 --device cpu ARGS` (the bundled demo model) as a subprocess, once
    it serves -> (the process, its base URL http://127.0.0.1:PORT/v1). The caller ends it."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli.cli", "serve", "--port", "0",
                             "--device", "cpu", *args], stderr=subprocess.PIPE, text=True,
                            env=env)
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if line.startswith("serving on "):
            break
    if not (lines and lines[-1].startswith("serving on http://127.0.0.1:")):
        proc.kill()
        raise AssertionError("".join(lines))
    proc.startup = "".join(lines)  # what it said on stderr up to serving
    return proc, lines[-1].split()[-1]


def stop_server(proc: subprocess.Popen) -> None:
    """End a `hearth_serve` process: SIGTERM, then SIGKILL if it has not gone in 30 s."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    proc.stderr.close()


class DraftModel:
    """A draft model proposing for one sequence alone: a batch of one of spec/draft_rows.py's
    rows, what a draft row gives when no other row drafts beside it (the reference the batched
    draft rows are held to)."""

    name = "draft"

    def __init__(self, draft_session, vocab: int):
        from engine.spec.draft_rows import DraftRows, DraftSeq

        self.rows = DraftRows(draft_session, vocab, 1)
        self.seq = DraftSeq()

    def start(self, ids: list[int]) -> None:
        self.rows.release(self.seq)

    def propose(self, seq: list[int], k: int, sampler, grammar=None):
        """-> (tokens [k], their distributions [k, V] or None for greedy)."""
        from engine.spec.draft_rows import Ask

        return self.rows.propose([Ask(self.seq, seq, k, sampler, grammar)])[self.seq]

    def commit(self, accepted: list[int], proposed: int) -> None:
        self.seq.commit(accepted, proposed)
