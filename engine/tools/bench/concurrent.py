"""`hearth bench --concurrency N[,N...]`: the seed's `benchmark(llm, prompts, max_tokens)`, N
prompts submitted at once to one Engine (the queue every front end uses), with the latency
spread, beside batch 1 and transformers' own continuous batching (peer_batching.py). The engine
is started and its model loaded on its thread as `hearth serve` does (service/start.py), so the
bench measures what the server runs.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import asdict, dataclass, field

from engine.config import overrides
from engine.events import (
    BadRequest,
    Failed,
    Finished,
    GenerateRequest,
    Loaded,
    LoadRequest,
    SamplingParams,
    Token,
)
from engine.generate import session_events
from engine.generate.session import Session
from engine.load import loader
from engine.plan.memory import KV_BLOCK_SIZE
from engine.service import start
from engine.service.engine import Engine
from engine.tools.bench import memory_peak, peer_batching
from engine.tools.bench.decode import _device_name, _folder_for_random, _prompts
from engine.tools.bench.timing import Round, Timing, median_round, summarize

DEFAULT_REPEATS = 3
MIN_CONTEXT = 16  # LoadRequest's least: a tiny prompt and answer still load
def batching(session: Session) -> str:
    """What the engine does with N requests on this session."""
    return session_events.batching_note(session)


@dataclass
class ConcurrentResult:
    model: str
    device: str
    quant: str
    kv_dtype: str
    decode_path: str
    prompt_len: int
    new_tokens: int
    repeats: int
    batching: str
    batch_1: Round  # one request alone, before the sweep
    rows: list[Round]  # one per --concurrency value
    preemptions: int = 0  # sequences preempted (and recomputed) over every round
    memory: dict = field(default_factory=dict)  # memory_peak.figures: planned against NVML
    peer_transformers_generate_batch: dict = field(default_factory=dict)


class _Recorder:
    """A request's sink: the clock at each event, on the engine thread."""

    def __init__(self, timing: Timing):
        self.timing = timing
        self.done = threading.Event()

    def __call__(self, event) -> None:
        now = time.perf_counter()
        t = self.timing
        if isinstance(event, Token):
            t.token_s.extend([now] * len(event.token_ids))  # a block of ids lands at once
        elif isinstance(event, Finished | Failed):
            t.end_s = now
            if isinstance(event, Failed):
                t.error, t.bad_input = event.error, event.bad_input
            else:
                t.reason = event.reason
            self.done.set()


_ids = itertools.count()  # an id stays live until the engine thread lets go of its job


def run_round(engine: Engine, prompts: list[list[int]], new_tokens: int) -> Round:
    """Submit every prompt at once, wait for every stream's end -> the round's figures."""
    return summarize(*submit_all(engine, prompts, new_tokens))


def submit_all(engine: Engine, prompts: list[list[int]], new_tokens: int
               ) -> tuple[list[Timing], float]:
    """-> each request's clock readings, and the clock just before the first submit."""
    timings = [Timing(0.0) for _ in prompts]
    sinks = [_Recorder(t) for t in timings]
    t_start = time.perf_counter()
    for ids, timing, sink in zip(prompts, timings, sinks, strict=True):
        req = GenerateRequest(prompt_ids=tuple(ids), max_new_tokens=new_tokens, ignore_eos=True,
                              sampling=SamplingParams(temperature=0.0))
        timing.submit_s = time.perf_counter()
        engine.submit(req, sink, request_id=f"bench-{next(_ids)}")
    for sink in sinks:
        sink.done.wait()
    failed = [t for t in timings if t.error is not None]
    if failed:
        raise (BadRequest if failed[0].bad_input else RuntimeError)(failed[0].error)
    return timings, t_start


def load_request(args) -> LoadRequest:
    """The model as the batch-1 bench loads it (decode.run), on one device, with an arena that
    holds every sequence of the largest round whole (no preemption)."""
    context = max(args.prompt_len + args.new_tokens, MIN_CONTEXT)
    per_seq = -(-context // KV_BLOCK_SIZE) * KV_BLOCK_SIZE
    req = LoadRequest(model=args.model, quant=args.quant, kv_dtype=args.kv_dtype,
                      context=context, kv_tokens=max(args.concurrency) * per_seq,
                      device=args.device, memory_limit_gib=args.memory_limit, eager=args.eager,
                      compile=args.compile, lm_head=args.lm_head)
    req.validate()
    return req


def _load(args) -> Session:
    """A Session with random weights (--random-weights: no folder for the engine to load), for
    the bench and the lab's scripts to hand to an Engine."""
    req = load_request(args)
    lm = loader.random_model(_folder_for_random(args.model), req, overrides.backends())
    return Session(lm, args.kv_dtype, fast_path=not args.eager, compile_layers=args.compile,
                   kv_tokens=req.kv_tokens)


def started(args) -> tuple[Engine, threading.Thread]:
    """The bench's engine: started as `hearth serve` starts its own, the model loaded on its
    thread through the same load (a random-weights session is built here and handed over)."""
    engine, thread = start.start("hearth-bench-engine", max_waiting=max(args.concurrency))
    if args.random_weights:
        engine.session = _load(args)
        return engine, thread
    loaded = start.load(engine, load_request(args))
    if not isinstance(loaded, Loaded):
        engine.stop()
        thread.join()
        if isinstance(loaded, Failed):
            raise (BadRequest if loaded.bad_input else RuntimeError)(loaded.error)
        raise RuntimeError("the load was cancelled")
    return engine, thread


def measure(engine: Engine, thread: threading.Thread, concurrency: list[int], prompt_len: int,
            new_tokens: int, repeats: int, peer: bool = True) -> ConcurrentResult:
    """The rounds on `engine` (running on `thread`, a session loaded), then the engine stopped
    and transformers' peer on the same model."""
    session = engine.session
    lm = session.lm
    vocab = lm.model.config.vocab_size
    seeds = itertools.count(1)  # fresh prompts each round: no prefix is cached from the last
    prompts = lambda n: _prompts(n, prompt_len, vocab, seed=next(seeds))  # noqa: E731
    try:
        with memory_peak.PeakSampler(lm.device) as sampler:
            run_round(engine, prompts(1), min(new_tokens, 4))  # warm-up: allocator, kernels
            batch_1 = median_round([run_round(engine, prompts(1), new_tokens)
                                    for _ in range(repeats)])
            rows = [median_round([run_round(engine, prompts(n), new_tokens)
                                  for _ in range(repeats)]) for n in concurrency]
    finally:
        engine.stop()
        thread.join()
    result = ConcurrentResult(
        model=str(lm.folder.path), device=_device_name(lm.device), quant=lm.quant,
        kv_dtype=session.kv_dtype, decode_path=session.decoder.mode, prompt_len=prompt_len,
        new_tokens=new_tokens, repeats=repeats, batching=batching(session), batch_1=batch_1,
        rows=rows, preemptions=engine.batch.scheduler.num_preemptions if engine.batch else 0,
        memory=memory_peak.figures(session, sampler, max(concurrency)))
    # after the engine's rounds: its thread is gone, the model is free
    result.peer_transformers_generate_batch = peer_batching.measure(
        lm.model, lm.device, concurrency, prompts, prompt_len, new_tokens, repeats) if peer \
        else {"unavailable": "left out (--no-peer)"}
    return result


def _ms(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a:,.1f} / {b:,.1f}"


def _row(name: str, r: Round, base: float | None) -> str:
    agg = r.aggregate_decode_tokens_per_s
    times = f"{agg / base:.2f}x" if agg and base else "-"
    agg_text = "-" if agg is None else f"{agg:,.1f}"
    return (f"| {name} | {r.concurrency} | {r.total_time:.3f} | {r.total_tokens} | "
            f"{r.throughput:,.1f} | {r.avg_latency:.4f} | {agg_text} | {times} | "
            f"{_ms(r.ttft_ms_p50, r.ttft_ms_p99)} | {_ms(r.itl_ms_p50, r.itl_ms_p99)} |")


def markdown(r: ConcurrentResult) -> str:
    base = r.batch_1.aggregate_decode_tokens_per_s
    lines = [
        f"{r.model} on {r.device}: {r.quant} weights, {r.kv_dtype} KV, decode path "
        f"{r.decode_path}; {r.prompt_len}-token prompts, {r.new_tokens} new tokens, median of "
        f"{r.repeats}; the engine: {r.batching}; {r.preemptions} preemptions",
        "",
        "| run | N | total_time s | total_tokens | throughput tokens/s | avg_latency s | "
        "aggregate decode tokens/s | x engine batch 1 | TTFT p50 / p99 ms | ITL p50 / p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
        _row("engine, one request alone", r.batch_1, base),
        *(_row("engine", row, base) for row in r.rows),
    ]
    m = r.memory
    if m.get("nvml_peak_bytes"):
        lines += ["", f"memory: planned {m['predicted_bytes'] / 2**30:.2f} GiB for "
                  f"{m['planned_sequences']} whole contexts at once, NVML peak "
                  f"{m['nvml_peak_bytes'] / 2**30:.2f} GiB (ratio "
                  f"{m['predicted_over_nvml_peak']:.3f}); torch reserved at most "
                  f"{m['torch_peak_reserved_bytes'] / 2**30:.2f} GiB", ""]
    peer = r.peer_transformers_generate_batch
    if peer.get("unavailable"):
        lines.append(f"| transformers generate_batch | - | {peer['unavailable']} |")
    for row in peer.get("rows", ()):
        if "not_run" in row:
            lines.append(f"| transformers generate_batch | {row['concurrency']} | "
                         f"{row['not_run']} |")
        else:
            lines.append(_row("transformers generate_batch", Round(**row), base))
    if peer.get("settings"):
        settings = "; ".join(f"{k}: {v}" for k, v in peer["settings"].items())
        lines += ["", f"transformers {peer['transformers']} generate_batch: {settings}"]
    return "\n".join(lines) + "\n"


def check_args(args) -> None:
    """What --concurrency cannot be combined with (yet), one sentence each."""
    if args.draft or args.prompt_lookup or args.num_speculative_tokens is not None:
        raise BadRequest("--concurrency measures plain decoding; speculation is a batch-of-one "
                         "feature (leave out --draft, --prompt-lookup, --num-speculative-tokens)")
    if args.synthetic_acceptance is not None or args.prompts or args.turns is not None:
        raise BadRequest("--concurrency draws random prompts of --prompt-len tokens; leave out "
                         "--prompts, --turns and --synthetic-acceptance")
    if args.tensor_parallel != 1:
        raise BadRequest("--concurrency runs on one device so far; leave out --tensor-parallel")
    if args.prompt_len < 1 or args.new_tokens < 2:
        raise BadRequest("--prompt-len must be >= 1 and --new-tokens >= 2")


def run_cli(args) -> int:
    check_args(args)
    repeats = DEFAULT_REPEATS if args.repeats is None else args.repeats
    result = measure(*started(args), list(args.concurrency), args.prompt_len, args.new_tokens,
                     repeats, peer=not args.no_peer)
    as_dict = asdict(result)
    print(json.dumps(as_dict) if args.json else markdown(result), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(as_dict, f, indent=1)
    return 0
