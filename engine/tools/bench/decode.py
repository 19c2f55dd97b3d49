"""`hearth bench`: time to first token, prefill and decode speed, peak memory, and the seed's
throughput over a set of prompts, beside two references measured in the same run
(references.py): the memory roofline and (with --baseline-hf) plain transformers
`generate()` on the same model.

Requests run one after another at batch 1; many at once is `hearth bench --concurrency`
(concurrent.py).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch

from engine.config import overrides
from engine.events import (
    BadRequest,
    Failed,
    Finished,
    GenerateRequest,
    LoadRequest,
    SamplingParams,
    Token,
)
from engine.files.model_folder import config_only_folder
from engine.generate.reproducible import reproducible_of
from engine.generate.session import Session
from engine.load import loader
from engine.platform import telemetry
from engine.tools.bench.references import (
    active_experts,
    copy_bandwidth,
    decode_bytes,
    hf_generate,
    sync,
)
from engine.tools.bench.speculative import SpecArgs

NUM_RUNS = 3


@dataclass
class BenchResult:
    model: str
    device: str
    quant: str
    kv_dtype: str
    decode_path: str
    prompt_len: int
    new_tokens: int
    ttft_ms: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float  # median of the runs: NUM_RUNS, or every --prompts prompt
    decode_runs_tokens_per_s: list[float]
    peak_vram_bytes: int
    torch_peak_reserved_bytes: int
    load_s: float
    copy_bandwidth_bytes_per_s: float
    bytes_per_decode_step: int
    roofline_tokens_per_s: float
    roofline_fraction: float
    effective_bandwidth_bytes_per_s: float  # decode tokens/s x bytes a step (weights and KV)
    throughput_tokens_per_s: float  # the seed's benchmark: total new tokens / elapsed
    avg_latency_s: float
    num_prompts: int
    batching: str = "sequential, batch 1 (many at once: --concurrency)"
    hf_generate_decode_tokens_per_s: float | None = None
    hf_generate_ttft_ms: float | None = None
    speedup_vs_hf: float | None = None
    speculative: dict | None = None  # speculative.SpeculativeResult, with --draft etc.
    tensor_parallel: int = 1  # GPUs (or CPU processes) the model is cut across
    peak_vram_bytes_per_gpu: list[int | None] | None = None  # NVML, per rank (tensor parallel)
    notes: list[str] = field(default_factory=list)
    lm_head: str = "16bit"  # --lm-head: the lm_head's own format
    # a mixture of experts: [experts a token reads, experts a layer]; the roofline's bytes
    # count only the ones read (references.decode_bytes)
    active_experts: list[int] | None = None


_folder_for_random = config_only_folder  # the name the device scripts import


def _prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab - 1, (length,), generator=g).tolist() for _ in range(n)]


def _run_one(session: Session, ids: list[int], new_tokens: int, prompt_lookup: bool = False,
             num_speculative_tokens: int | None = None) -> tuple[Finished, list[int]]:
    """One greedy generation from an empty cache -> (its Finished, the new token ids)."""
    session.cache.clear()  # every run prefills the whole prompt
    if session.draft is not None:
        session.draft.cache.clear()
    req = GenerateRequest(prompt_ids=tuple(ids), max_new_tokens=new_tokens, ignore_eos=True,
                          sampling=SamplingParams(temperature=0.0), prompt_lookup=prompt_lookup,
                          num_speculative_tokens=num_speculative_tokens)
    events = list(session.generate(req))
    if isinstance(events[-1], Failed):
        raise (BadRequest if events[-1].bad_input else RuntimeError)(events[-1].error)
    return events[-1], [i for e in events if isinstance(e, Token) for i in e.token_ids]


def read_prompts(session: Session, path: str) -> list[list[int]]:
    """--prompts FILE: one JSON string a line (a user message, through the chat template)."""
    if session.lm.tokenizer is None:
        raise BadRequest("--prompts needs a tokenizer; leave out --random-weights")
    try:
        with open(path, encoding="utf-8") as f:
            texts = [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        raise BadRequest(f"cannot read prompts from {path}: {e}") from None
    if not texts or not all(isinstance(t, str) and t for t in texts):
        raise BadRequest(f"{path} must hold one non-empty JSON string a line")
    return [session.prompt_ids(GenerateRequest(prompt=t)) for t in texts]


def run(model: str | None, random_weights: bool, quant: str, kv_dtype: str, prompt_len: int,
        new_tokens: int, num_prompts: int, eager: bool, compile_layers: bool,
        baseline_hf: bool, device: str, memory_limit_gib: float | None,
        spec: SpecArgs | None = None, tensor_parallel: int = 1,
        lm_head: str = "16bit", reproducible: bool | None = None) -> BenchResult:
    spec = spec or SpecArgs()
    context = prompt_len + new_tokens
    if spec.prompts_file:  # the file decides the prompt lengths; the model's context holds them
        context = None
    req = LoadRequest(model=model, quant=quant, kv_dtype=kv_dtype, context=context,
                      device=device, memory_limit_gib=memory_limit_gib, eager=eager,
                      compile=compile_layers, draft=spec.draft, tensor_parallel=tensor_parallel,
                      lm_head=lm_head, reproducible=reproducible)
    req.validate()
    if tensor_parallel > 1 and baseline_hf:
        raise BadRequest("--baseline-hf runs transformers on one device; leave it out with "
                         "--tensor-parallel")
    t0 = time.perf_counter()
    load_req = req
    if tensor_parallel > 1:  # the whole model in host memory, then cut (parallel/session.py)
        from engine.parallel import session as tp_session

        tp_device = tp_session.device_for(req)
        load_req = tp_session.host_request(req, tp_device)
    if random_weights and tensor_parallel > 1:
        lm = tp_session.random_host_model(_folder_for_random(model), req, tp_device)
    elif random_weights:
        lm = loader.random_model(_folder_for_random(model), load_req, overrides.backends())
    else:
        from engine.files.model_folder import check

        lm = loader.load(check(model), load_req, lambda e: None,
                         backends=overrides.backends())
    if tensor_parallel > 1:
        session = tp_session.TPSession(lm, req, tp_device, overrides.backends())
    else:
        session = Session(lm, kv_dtype, fast_path=not eager, compile_layers=compile_layers,
                          reproducible=reproducible)
    try:
        return _measure(session, prompt_len, new_tokens, num_prompts, baseline_hf, spec,
                        random_weights, req, t0)
    finally:
        if tensor_parallel > 1:
            session.close()  # the follower processes end with the benchmark


def _measure(session: Session, prompt_len: int, new_tokens: int, num_prompts: int,
             baseline_hf: bool, spec: SpecArgs, random_weights: bool, req: LoadRequest,
             t0: float) -> BenchResult:
    lm = session.lm  # under tensor parallelism: rank 0's device
    dev = lm.device
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    vocab = lm.model.config.vocab_size
    if spec.prompts_file:
        prompts = read_prompts(session, spec.prompts_file)
        runs_n = max(NUM_RUNS, len(prompts))
        prompts = [prompts[i % len(prompts)] for i in range(max(num_prompts, runs_n))]
        longest = max(map(len, prompts))
        if longest + new_tokens > lm.context:
            raise BadRequest(f"a prompt of {longest} tokens and {new_tokens} new ones exceed "
                             f"the context of {lm.context}")
        prompt_len = round(statistics.mean(map(len, prompts[:runs_n])))
    else:
        runs_n = NUM_RUNS
        prompts = _prompts(max(num_prompts, NUM_RUNS), prompt_len, vocab, seed=0)
    _run_one(session, prompts[0][:16], 4)  # warm-up: allocator, kernels, lazy init
    load_s = time.perf_counter() - t0

    plain = [_run_one(session, prompts[i], new_tokens) for i in range(runs_n)]
    runs = [fin.stats for fin, _ in plain]
    decode = statistics.median(s.decode_tokens_per_s for s in runs)
    sync(dev)
    t = time.perf_counter()
    total_new = 0
    for ids in prompts[:num_prompts]:
        total_new += _run_one(session, ids, new_tokens)[0].stats.new_tokens
    elapsed = time.perf_counter() - t

    bw = copy_bandwidth(dev)
    per_token = session.cache.bytes_per_token  # one rank's KV heads
    n = req.tensor_parallel
    # one GPU's step: 1/N of the weights read (each rank's cut; the replicated norms are noise),
    # its own KV heads; the roofline leaves out the all-reduces' latency
    step_bytes = decode_bytes(lm.model, 0, 0) // n + per_token * (prompt_len + new_tokens)
    roofline = bw / step_bytes
    result = BenchResult(
        model=str(lm.folder.path), device=_device_name(dev), quant=lm.quant,
        kv_dtype=session.kv_dtype, decode_path=session.decoder.mode, prompt_len=prompt_len,
        new_tokens=new_tokens, ttft_ms=statistics.median(s.ttft_ms for s in runs),
        prefill_tokens_per_s=statistics.median(s.prefill_tokens_per_s for s in runs),
        decode_tokens_per_s=decode,
        decode_runs_tokens_per_s=[s.decode_tokens_per_s for s in runs],
        peak_vram_bytes=telemetry.vram_used_bytes(dev),
        torch_peak_reserved_bytes=int(torch.cuda.max_memory_reserved(dev))
        if dev.type == "cuda" else 0,
        load_s=round(load_s, 2), copy_bandwidth_bytes_per_s=bw, bytes_per_decode_step=step_bytes,
        roofline_tokens_per_s=round(roofline, 1), roofline_fraction=round(decode / roofline, 3),
        effective_bandwidth_bytes_per_s=round(decode * step_bytes),
        throughput_tokens_per_s=round(total_new / elapsed, 2),
        avg_latency_s=round(elapsed / num_prompts, 4), num_prompts=num_prompts,
        tensor_parallel=n, peak_vram_bytes_per_gpu=_per_gpu_vram(session),
        notes=list(session.loaded_event().notes), lm_head=req.lm_head,
        active_experts=None if active_experts(lm.model) == (1, 1) else [
            *active_experts(lm.model)])
    if spec.draft or spec.prompt_lookup:
        from engine.tools.bench import speculative as bench_speculative

        draft = (bench_speculative.load_draft(session, spec.draft, random_weights, req)
                 if spec.draft else None)
        measured = bench_speculative.measure(
            session, prompts[:runs_n], plain, _run_one, draft, spec.prompt_lookup,
            spec.num_speculative_tokens, spec.synthetic_acceptance)
        result.speculative = asdict(measured)
    if baseline_hf:
        ttft, rate = hf_generate(lm.model, prompts[0], new_tokens, dev)
        result.hf_generate_ttft_ms = round(ttft, 2)
        result.hf_generate_decode_tokens_per_s = round(rate, 2)
        result.speedup_vs_hf = round(decode / rate, 2)
    return result


def _per_gpu_vram(session: Session) -> list[int | None] | None:
    """NVML's memory of each rank's process on its GPU (rank r on cuda:r), tensor parallel."""
    from engine.parallel.session import TPSession

    if not isinstance(session, TPSession) or session.lm.device.type != "cuda":
        return None
    from engine.platform.gpu import process_used_bytes

    pids = {0: os.getpid(), **session.leader.follower_pids}
    return [process_used_bytes(pid, r) for r, pid in sorted(pids.items())]


def _device_name(dev: torch.device) -> str:
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def markdown(r: BenchResult) -> str:
    rows = [
        ("model", r.model), ("device", r.device), ("weights / KV", f"{r.quant} / {r.kv_dtype}"),
        ("decode path", r.decode_path), ("prompt / new tokens", f"{r.prompt_len} / {r.new_tokens}"),
        ("time to first token", f"{r.ttft_ms:.1f} ms"),
        ("prefill", f"{r.prefill_tokens_per_s:,.0f} tokens/s"),
        (f"decode (median of {len(r.decode_runs_tokens_per_s)})",
         f"{r.decode_tokens_per_s:,.1f} tokens/s"),
        ("roofline", f"{r.roofline_tokens_per_s:,.1f} tokens/s "
                     f"({r.copy_bandwidth_bytes_per_s / 1e12:.2f} TB/s / "
                     f"{r.bytes_per_decode_step / 1e9:.3f} GB a step"
                     + ("" if r.active_experts is None else ", the {} of {} experts a token "
                        "reads".format(*r.active_experts)) + "); "
                     f"achieved {100 * r.roofline_fraction:.1f}%"),
        ("effective bandwidth", f"{r.effective_bandwidth_bytes_per_s / 1e12:.2f} TB/s "
                                "(decode tokens/s x the bytes a step reads)"),
        ("peak VRAM (NVML, process)", f"{r.peak_vram_bytes / 2**30:.2f} GiB"),
        ("throughput / avg latency", f"{r.throughput_tokens_per_s:,.1f} tokens/s / "
                                     f"{r.avg_latency_s:.3f} s over {r.num_prompts} prompts, "
                                     f"{r.batching}"),
    ]
    if r.tensor_parallel > 1:
        per_gpu = ", ".join("?" if b is None else f"{b / 2**30:.2f}"
                            for b in r.peak_vram_bytes_per_gpu or ())
        rows.insert(2, ("tensor parallel", f"{r.tensor_parallel} ranks; roofline and VRAM per "
                                           f"GPU" + (f"; NVML GiB by rank: {per_gpu}"
                                                     if per_gpu else "")))
    if r.hf_generate_decode_tokens_per_s is not None:
        rows.append(("plain generate()", f"{r.hf_generate_decode_tokens_per_s:,.1f} tokens/s, "
                                         f"ttft {r.hf_generate_ttft_ms:.1f} ms; engine is "
                                         f"{r.speedup_vs_hf}x"))
    if r.speculative is not None:
        from engine.tools.bench.speculative import SpeculativeResult, markdown_rows

        rows += markdown_rows(SpeculativeResult(**r.speculative))
    lines = ["| measure | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]
    return "\n".join(lines) + "\n"


def run_cli(args) -> int:
    if args.turns is not None:
        raise BadRequest("--turns is not available yet; use --num-prompts")
    if args.prompt_len < 1 or args.new_tokens < 2 or args.num_prompts < 1:
        raise BadRequest("--prompt-len must be >= 1, --new-tokens >= 2, --num-prompts >= 1")
    if args.synthetic_acceptance is not None and not args.draft:
        raise BadRequest("--synthetic-acceptance needs --draft (its forward is the cost)")
    if args.num_speculative_tokens is not None and not (args.draft or args.prompt_lookup):
        raise BadRequest("--num-speculative-tokens needs --draft PATH or --prompt-lookup")
    LoadRequest(num_speculative_tokens=args.num_speculative_tokens).validate()
    spec = SpecArgs(args.draft, args.prompt_lookup, args.num_speculative_tokens,
                    args.synthetic_acceptance, args.prompts)
    result = run(args.model, args.random_weights, args.quant, args.kv_dtype, args.prompt_len,
                 args.new_tokens, args.num_prompts, args.eager, args.compile, args.baseline_hf,
                 args.device, args.memory_limit, spec, args.tensor_parallel, args.lm_head,
                 reproducible_of(args))
    print(json.dumps(asdict(result)) if args.json else markdown(result), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(asdict(result), f, indent=1)
    return 0
