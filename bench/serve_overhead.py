"""On a CPU: what `hearth serve`'s event loop costs the engine thread. A stand-in engine
whose step holds the GIL for a fixed amount of Python (--python-ms when alone) and then releases
it in time.sleep (the GPU's wait, --gpu-ms), one token per live request per step, runs under the
real app (engine/server) with streaming clients (httpx, in a process of their own), and against
the same steps with in-process sinks (the engine's own round). Not a test: numbers only.

    .venv/bin/python bench/serve_overhead.py [--clients 16] [--new-tokens 256]
        [--python-ms 1] [--gpu-ms 4] [--gil-drops 0] [--repeats 3] [--chat]
        [--switch-interval-ms MS] [--paths engine,server]

Rounds of the two paths alternate. Prints one JSON line per path, medians over the repeats: the
engine's steps/s while every row runs (and the server's over the engine's, round by round), the
server's CPU per SSE chunk (the process's CPU time less the engine thread's, over the chunks the
clients read), client TTFT p50, the spread of the submissions as the engine saw them, and where
the engine thread's step went (wall ms of its Python, GPU wait, events given out, step-end wakeup).
--gil-drops lets the GIL go inside the step's Python as torch calls do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

DEMO = Path(__file__).resolve().parents[1] / "hearth_resources" / "demo_model"
WORDS = tuple(f" w{i}" for i in range(97)) + (' "quoted"', " é", "\n")


def spin(n: int) -> int:
    """A fixed amount of pure Python (the step's launch, sampling bookkeeping, detokenizing)."""
    acc = 0
    for i in range(n):
        acc = (acc + i * i) % 1_000_003
    return acc


def calibrate(seconds: float) -> int:
    n = 20_000
    t0 = time.perf_counter()
    spin(n)
    return max(1, int(n * seconds / (time.perf_counter() - t0)))


class StandIn:
    """service.Engine's surface that the app uses (submit, cancel, counts), over fake steps."""

    session = None  # /metrics reads no KV blocks from it

    def __init__(self, python_s: float, gpu_s: float, num_gil_drops: int = 0):
        self.gpu_s, self.num_gil_drops = gpu_s, num_gil_drops
        self.spin_n = calibrate(python_s) // (num_gil_drops + 1)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._new: list[list] = []
        self._rows: list[list] = []  # [req, sink, id, tokens so far]
        self._cancelled: set[str | None] = set()
        self._stop = False
        self.tokens_generated = 0
        self.steps: list[tuple] = []
        # (end time, rows, then the wall ms of its Python, its GPU wait, its events, the wakeup)
        self.submits: list[float] = []
        self.cpu_s = 0.0  # this thread's CPU time in steps
        self._step_ends: list = []

    def on_step_end(self, callback) -> None:
        """As service.Engine: callback() on this thread once each step's events are out."""
        self._step_ends.append(callback)

    @property
    def num_running(self) -> int:
        return len(self._rows)

    @property
    def num_waiting(self) -> int:
        return len(self._new)

    def submit(self, req, sink, request_id=None):
        with self._lock:
            self._new.append([req, sink, request_id, 0])
            self.submits.append(time.perf_counter())
        self._wake.set()

    def cancel(self, request_id=None) -> int:
        with self._lock:
            self._cancelled.add(request_id)
        return 1

    def stop(self) -> None:
        self._stop = True
        self._wake.set()

    def run(self) -> None:
        from engine.events import Finished, Stats, Token

        while not self._stop:
            with self._lock:
                self._rows += self._new
                self._new.clear()
                cancelled, self._cancelled = self._cancelled, set()
            if not self._rows:
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            t_cpu, t0 = time.thread_time(), time.perf_counter()
            spin(self.spin_n)
            for _ in range(self.num_gil_drops):  # a torch op drops the GIL around its dispatch
                time.sleep(0)
                spin(self.spin_n)
            t1 = time.perf_counter()
            time.sleep(self.gpu_s)  # the GPU's wait: the GIL is free for the event loop
            t2 = time.perf_counter()
            alive = []
            for row in self._rows:
                req, sink, rid, n = row
                if rid in cancelled or None in cancelled:
                    sink(Finished("cancelled", Stats(new_tokens=n)))
                    continue
                row[3] = n = n + 1
                self.tokens_generated += 1
                sink(Token(WORDS[(n * 7 + len(alive)) % len(WORDS)], (n,)))
                if n >= req.max_new_tokens:
                    sink(Finished("max_tokens", Stats(len(req.prompt_ids), n)))
                else:
                    alive.append(row)
            t3 = time.perf_counter()
            for callback in self._step_ends:
                callback()
            t4 = time.perf_counter()
            self.steps.append((t4, len(self._rows), (t1 - t0) * 1e3, (t2 - t1) * 1e3,
                               (t3 - t2) * 1e3, (t4 - t3) * 1e3))
            self._rows = alive
            self.cpu_s += time.thread_time() - t_cpu


def full_steps(steps: list[tuple], rows: int) -> dict:
    """Over the steps where every row runs: steps/s, and the mean wall ms of each part."""
    full = [s for s in steps if s[1] == rows]
    if len(full) < 2:
        return dict(steps_per_s=0.0)
    out = dict(steps_per_s=(len(full) - 1) / (full[-1][0] - full[0][0]))
    for i, part in enumerate(("python_ms", "gpu_wait_ms", "events_ms", "wake_ms")):
        out[part] = statistics.fmean(s[2 + i] for s in full)
    out["events_wake_ms_p90"] = statistics.quantiles([s[4] + s[5] for s in full], n=10)[-1]
    return out


def engine_round(eng: StandIn, clients: int, prompt: list[int], new_tokens: int) -> dict:
    from engine.events import Finished, GenerateRequest

    done, events = threading.Semaphore(0), []

    def sink(event):  # one list for all, as cheap as run_round's
        events.append(event)
        if isinstance(event, Finished):
            done.release()

    t0 = time.perf_counter()
    for _ in range(clients):
        eng.submit(GenerateRequest(prompt_ids=tuple(prompt), max_new_tokens=new_tokens), sink)
    for _ in range(clients):
        done.acquire()
    return dict(chunks=0, ttft_ms=[], t0=t0)


async def stream_round(url: str, clients: int, prompt: list[int], new_tokens: int,
                       chat: bool) -> dict:
    import httpx

    if chat:
        path = "/chat/completions"
        words = " ".join(f"word{i}" for i in range(len(prompt)))
        body = {"messages": [{"role": "user", "content": words}]}
    else:
        path, body = "/completions", {"prompt": prompt}
    body |= {"model": "demo", "max_tokens": new_tokens, "stream": True, "temperature": 0,
             "stream_options": {"include_usage": True}, "ignore_eos": True}
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        async def one():
            first, chunks, text, done = None, 0, 0, False
            async with client.stream("POST", path, json=body) as r:
                assert r.status_code == 200, r.status_code
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    chunks += 1
                    if line == "data: [DONE]":
                        done = True
                        continue
                    obj = json.loads(line[6:])
                    if obj["choices"] and (obj["choices"][0].get("text") or obj["choices"][0]
                                           .get("delta", {}).get("content")):
                        first = first or time.perf_counter()
                        text += 1
            assert done and text == new_tokens, (done, text)
            return first, chunks

        t0 = time.perf_counter()
        results = await asyncio.gather(*(one() for _ in range(clients)))
    return dict(chunks=sum(c for _, c in results),
                ttft_ms=[(f - t0) * 1000 for f, _ in results])


def run_clients(url: str, clients: int, prompt: list[int], new_tokens: int, chat: bool) -> dict:
    """In a process of its own: the clients' Python must not share the server's GIL."""
    return asyncio.run(stream_round(url, clients, prompt, new_tokens, chat))


def measure(eng: StandIn, fn, clients: int) -> dict:
    eng.steps.clear()
    eng.submits.clear()
    cpu0, eng_cpu0 = time.process_time(), eng.cpu_s
    r = fn()
    server_cpu_s = (time.process_time() - cpu0) - (eng.cpu_s - eng_cpu0)
    return dict(**full_steps(eng.steps, clients), chunks=r["chunks"],
                server_cpu_us_per_chunk=server_cpu_s / r["chunks"] * 1e6 if r["chunks"] else 0,
                ttft_ms_p50=statistics.median(r["ttft_ms"]) if r["ttft_ms"] else 0.0,
                submit_spread_ms=(max(eng.submits) - min(eng.submits)) * 1000)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--python-ms", type=float, default=1.0)
    p.add_argument("--gpu-ms", type=float, default=4.0)
    p.add_argument("--gil-drops", type=int, default=0, help="times the step's Python lets the "
                   "GIL go (as each torch call does), spread over it")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--chat", action="store_true", help="chat messages (template + tokenizer) "
                   "instead of token-id prompts")
    p.add_argument("--switch-interval-ms", type=float, help="sys.setswitchinterval for the run")
    p.add_argument("--paths", default="engine,server", help="which rounds, in this order")
    args = p.parse_args()
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1000)

    from transformers import AutoTokenizer

    from engine.server.app import Settings, create_app
    from engine.server.model_view import ModelView
    from engine.server.runner import BackgroundServer, bind

    tok = AutoTokenizer.from_pretrained(DEMO)
    eng = StandIn(args.python_ms / 1000, args.gpu_ms / 1000, args.gil_drops)
    thread = threading.Thread(target=eng.run, name="stand-in-engine", daemon=True)
    thread.start()
    view = ModelView(tok, 8192, len(tok), ("demo",))
    sock = bind("127.0.0.1", 0)
    settings = Settings("127.0.0.1", sock.getsockname()[1], None, args.clients)
    server = BackgroundServer(create_app(eng, view, settings), eng, sock).start()
    clients = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    prompt = [(i * 31) % (len(tok) - 10) + 3 for i in range(args.prompt_len)]
    paths = {
        "engine": lambda: engine_round(eng, args.clients, prompt, args.new_tokens),
        "server": lambda: clients.submit(run_clients, server.url, args.clients, prompt,
                                         args.new_tokens, args.chat).result(),
    }
    try:
        clients.submit(run_clients, server.url, 1, prompt, 4, args.chat).result()  # warm-up
        names = args.paths.split(",")
        rows: dict[str, list[dict]] = {name: [] for name in names}
        for _ in range(args.repeats):  # interleaved: a noisy machine drifts between rounds
            for name in names:
                rows[name].append(measure(eng, paths[name], args.clients))
        for name in names:
            out = {k: round(statistics.median(r[k] for r in rows[name]), 2)
                   for k in rows[name][0]}
            if name != "engine" and "engine" in rows:
                out["steps_vs_engine"] = round(statistics.median(
                    s["steps_per_s"] / e["steps_per_s"]
                    for s, e in zip(rows[name], rows["engine"], strict=True)), 3)
            print(json.dumps(dict(path=name, clients=args.clients, chat=args.chat,
                                  switch_interval_ms=sys.getswitchinterval() * 1000, **out,
                                  steps_per_s_all=[round(r["steps_per_s"], 1)
                                                   for r in rows[name]])), flush=True)
    finally:
        clients.shutdown()
        server.stop()
        eng.stop()
        thread.join(10)


if __name__ == "__main__":
    main()
