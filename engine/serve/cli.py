"""The `hearth` command. Arguments and the model folder are checked before torch is imported,
so bad input fails at once with one sentence and exit code 2 (DESIGN.md: the CLI contract).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from importlib import metadata

from engine.events import (
    QUANTS,
    BadRequest,
    Failed,
    Finished,
    GenerateRequest,
    Loaded,
    LoadProgress,
    LoadRequest,
    SamplingParams,
    Token,
    event_to_json,
)
from engine.serve import chat_cli, import_cli

EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: one line, exit 2, like ours
        raise BadRequest(message)


MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed's range
MAX_TOP_K = 2**31 - 1  # torch.topk takes an int32 k


def _finite(text: str) -> float:
    """A float argument that is a real number: inf and nan are never a setting."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, not {text}")
    return value


def _whole(low: int, high: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text[:40]!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be a whole number from {low} to {high:,}")
        return value
    return parse


def _version() -> str:
    try:
        return metadata.version("hearth")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="hearth", description="Run large language models on your own GPU.")
    p.add_argument("--version", action="version", version=f"hearth {_version()}")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    gui = sub.add_parser("gui", help="open the desktop app (the default)")
    gui.add_argument("--model", help="open the window on this model folder or cached repo id")
    sub.add_parser("worker", help="the engine process the app drives (JSON lines)")

    run = sub.add_parser("run", help="generate from a prompt")
    run.add_argument("--model", help="model folder or cached Hugging Face repo id "
                     "(default: the bundled demo model)")
    src = run.add_mutually_exclusive_group()
    src.add_argument("--prompt")
    src.add_argument("--messages", metavar="FILE.json", help="a JSON list of chat messages")
    run.add_argument("--system")
    _load_args(run)
    spec = run.add_mutually_exclusive_group()
    spec.add_argument("--draft", metavar="PATH")
    spec.add_argument("--prompt-lookup", action="store_true")
    run.add_argument("--num-speculative-tokens", type=int)
    run.add_argument("--max-new-tokens", type=int, default=256)
    run.add_argument("--temperature", type=_finite)
    run.add_argument("--top-p", type=_finite)
    run.add_argument("--top-k", type=_whole(0, MAX_TOP_K))
    run.add_argument("--repetition-penalty", type=_finite)
    run.add_argument("--stop", action="extend", nargs="+", default=[], metavar="TEXT")
    run.add_argument("--seed", type=_whole(0, MAX_SEED))
    run.add_argument("--raw", action="store_true", help="no chat template: tokenize as is")
    run.add_argument("--json", action="store_true", help="one JSON event per line")
    run.add_argument("--endpoint", metavar="URL", help="stream from an OpenAI-compatible "
                     "endpoint (its base URL, e.g. http://host:8000/v1); --model is its model id")
    run.add_argument("--api-key", metavar="KEY", help="the endpoint's API key (or set "
                     "HEARTH_API_KEY, which `ps` does not show)")

    plan = sub.add_parser("plan", help="what fits in VRAM, before loading")
    plan.add_argument("--model", help="model folder (config.json is enough)")
    where = plan.add_mutually_exclusive_group()
    where.add_argument("--vram", type=_finite, metavar="GIB")
    where.add_argument("--gpu", choices=["auto"])
    plan.add_argument("--context", type=int)
    plan.add_argument("--quant", choices=QUANTS, default="auto")
    plan.add_argument("--kv-dtype", default="auto")
    plan.add_argument("--draft", metavar="PATH")
    plan.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                      help="plan for N cards (of --vram GIB each, or this machine's)")
    plan.add_argument("--json", action="store_true")

    bench = sub.add_parser("bench", help="time to first token, decode speed, memory")
    bench.add_argument("--model", help="model folder (with --random-weights: config.json only)")
    bench.add_argument("--random-weights", action="store_true")
    _load_args(bench, context=False)
    spec = bench.add_mutually_exclusive_group()
    spec.add_argument("--draft", metavar="PATH")
    spec.add_argument("--prompt-lookup", action="store_true")
    bench.add_argument("--num-speculative-tokens", type=int)
    bench.add_argument("--synthetic-acceptance", type=float)
    bench.add_argument("--prompt-len", type=int, default=512)
    bench.add_argument("--new-tokens", type=int, default=256)
    bench.add_argument("--prompts", metavar="FILE")
    bench.add_argument("--num-prompts", type=int, default=4)
    bench.add_argument("--turns", type=int)
    bench.add_argument("--eager", action="store_true", help="transformers' modules, no graphs")
    bench.add_argument("--compile", action="store_true", help="torch.compile the fused layer")
    bench.add_argument("--baseline-hf", action="store_true", help="also time plain generate()")
    bench.add_argument("--json", action="store_true")
    bench.add_argument("--out", metavar="FILE")

    ev = sub.add_parser("eval", help="perplexity over a text file")
    ev.add_argument("--model", help="model folder (default: the bundled demo model)")
    ev.add_argument("--text", required=True, metavar="FILE")
    ev.add_argument("--quant", default="auto")
    ev.add_argument("--kv-dtype", default="auto")
    ev.add_argument("--lm-head", default="16bit", help="16bit, or a quantized copy: int8, int4")
    ev.add_argument("--json", action="store_true")

    qz = sub.add_parser("quantize", help="make a 4-bit AWQ copy of a model folder")
    qz.add_argument("--model", help="a bf16/fp16 model folder (default: the bundled demo model)")
    qz.add_argument("--method", required=True, help="awq (or rtn: plain rounding to 4 bits in "
                    "the same format, the baseline AWQ improves on)")
    qz.add_argument("--out", required=True, metavar="PATH", help="a new folder for the copy")
    qz.add_argument("--calibration", metavar="FILE", help="calibration text (paragraphs split "
                    "at blank lines; default: the Python standard library's docstrings)")
    qz.add_argument("--device", default="auto")
    qz.add_argument("--num-samples", type=int, default=128)
    qz.add_argument("--seq-len", type=int, default=512)

    gpu = sub.add_parser("gpu", help="the GPUs NVML sees")
    gpu.add_argument("--json", action="store_true")

    sub.add_parser("doctor", help="check the Python, torch, CUDA, driver, bitsandbytes, "
                   "gptqmodel, Triton and Qt stack, and say how to fix what is missing")
    sub.add_parser("install-desktop", help="install the .desktop entry and icon for this user")
    import_cli.add_parser(sub)
    chat_cli.add_parser(sub)
    return p


def _load_args(p: argparse.ArgumentParser, context: bool = True) -> None:
    p.add_argument("--quant", default="auto")
    p.add_argument("--kv-dtype", default="auto")
    if context:
        p.add_argument("--context", type=int)
    p.add_argument("--device", default="auto")
    p.add_argument("--memory-limit", type=_finite, metavar="GIB")
    p.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                   help="cut the model across N GPUs (with --device cpu: N CPU processes)")
    p.add_argument("--lm-head", default="16bit", help="16bit, or a quantized copy: int8, int4")


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command in (None, "gui"):
            from engine.platform.child_env import child_env

            model = getattr(args, "model", None)  # `hearth` alone has no gui options
            if model is not None:
                from engine.files.model_folder import check

                check(model)  # a bad folder: one sentence here, not a failed load in the window
            app_args = ["--model", model] if model is not None else []
            return subprocess.call([sys.executable, "-m", "app", *app_args], env=child_env())
        if args.command == "worker":
            from engine.serve import worker

            worker.exit_now(worker.main())
        if args.command == "run":
            return _run(args)
        if args.command == "plan":
            from engine.tools.plan_report import run_plan

            return run_plan(args.model, args.vram, args.gpu, args.context, args.quant,
                            args.kv_dtype, args.draft, args.json,
                            tensor_parallel=args.tensor_parallel)
        if args.command == "bench":
            from engine.files.model_folder import check, resolve

            if not args.random_weights:
                check(args.model)
            elif not (resolve(args.model) / "config.json").is_file():
                raise BadRequest(f"{args.model} has no config.json")
            if args.tensor_parallel != 1:  # before torch, as for `run`
                from engine.parallel import request as tp_request

                tp = LoadRequest(quant=args.quant, kv_dtype=args.kv_dtype, device=args.device,
                                 eager=args.eager, draft=args.draft,
                                 tensor_parallel=args.tensor_parallel)
                tp.validate()
                tp_request.check(tp, resolve(args.model))
            from engine.tools import bench

            return bench.run_cli(args)
        if args.command == "eval":
            from engine.tools.eval import run_eval

            return run_eval(args.model, args.text, args.quant, args.kv_dtype, args.json,
                            lm_head=args.lm_head)
        if args.command == "quantize":
            from engine.tools.quantize import run_quantize

            return run_quantize(args.model, args.method, args.out, args.calibration, args.device,
                                args.num_samples, args.seq_len)
        if args.command == "gpu":
            from engine.tools.plan_report import run_gpu

            return run_gpu(args.json)
        if args.command == "doctor":
            from engine.tools import doctor

            return doctor.main()
        if args.command == "import":
            return import_cli.run(args)
        if args.command == "chat":
            return chat_cli.run(args)
        if args.command == "install-desktop":
            from engine.tools import desktop_entry

            return desktop_entry.main()
    except BadRequest as e:
        print(f"hearth: {_one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # not the user's fault: still one line, the traceback on request
        from engine.plan.oom import OutOfMemory

        if isinstance(e, OutOfMemory):  # memory released; the hint names settings that fit
            print(f"hearth: {e} ({e.hint})", file=sys.stderr)
            return EXIT_ERROR
        if os.environ.get("HEARTH_DEBUG", "").strip().lower() in ("1", "true", "yes"):
            raise
        print(f"hearth: error: {type(e).__name__}: {_one_line(e)} (set HEARTH_DEBUG=1 for "
              "details)", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_ERROR


def _one_line(e: BaseException) -> str:
    """Messages from libraries may span lines (a load report, a validation error)."""
    return " ".join(str(e).split())


def _is_text(value: str) -> bool:
    """False for a lone surrogate: invalid UTF-8 in argv (surrogateescape) or a JSON escape."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _read_messages(path: str) -> tuple[dict, ...]:
    try:
        with open(path, encoding="utf-8") as f:
            messages = json.load(f)
    except UnicodeDecodeError as e:
        raise BadRequest(f"cannot read messages from {path}: it is not UTF-8 text (byte "
                         f"{e.start}); save it as UTF-8") from None
    except RecursionError:
        raise BadRequest(f"cannot read messages from {path}: its JSON is nested too "
                         "deeply") from None
    except (OSError, json.JSONDecodeError) as e:
        raise BadRequest(f"cannot read messages from {path}: {e}") from None
    if not isinstance(messages, list) or not messages:
        raise BadRequest(f"{path} must hold a non-empty JSON list of messages")
    for m in messages:
        if isinstance(m, dict) and not all(_is_text(v) for v in m.values()
                                           if isinstance(v, str)):
            raise BadRequest(f"{path} holds a message that is not valid Unicode text (a lone "
                             "surrogate escape such as \\ud800)")
    return tuple(messages)


def _requests(args) -> tuple[LoadRequest, GenerateRequest]:
    if args.num_speculative_tokens is not None and not (args.draft or args.prompt_lookup):
        raise BadRequest("--num-speculative-tokens needs --draft PATH or --prompt-lookup")
    for flag, value in (("--prompt", args.prompt), ("--system", args.system),
                        *(("--stop", s) for s in args.stop)):
        if value is not None and not _is_text(value):
            raise BadRequest(f"{flag} is not valid UTF-8 text")
    messages = None
    if args.messages:
        messages = _read_messages(args.messages)
    elif args.prompt is None:
        raise BadRequest("give a --prompt or a --messages file")
    load = LoadRequest(model=args.model, quant=args.quant, kv_dtype=args.kv_dtype,
                       context=args.context, device=args.device,
                       memory_limit_gib=args.memory_limit, draft=args.draft,
                       num_speculative_tokens=args.num_speculative_tokens,
                       tensor_parallel=args.tensor_parallel, lm_head=args.lm_head)
    gen = GenerateRequest(prompt=args.prompt, messages=messages, system=args.system,
                          raw=args.raw, max_new_tokens=args.max_new_tokens, stop=tuple(args.stop),
                          sampling=SamplingParams(args.temperature, args.top_p, args.top_k,
                                                  args.repetition_penalty, args.seed),
                          prompt_lookup=args.prompt_lookup)
    load.validate()
    gen.validate()
    return load, gen


def _speculation(s) -> str:
    if not s.speculation:
        return ""
    speedup = f", {s.speculative_speedup:.2f}x a plain step" if s.speculative_speedup else ""
    return (f"; {s.speculation.replace('_', ' ')}: {s.accepted_draft_tokens} of "
            f"{s.proposed_draft_tokens} proposed tokens accepted, mean accepted length "
            f"{s.mean_accepted_length:.2f}{speedup}")


def _run(args) -> int:
    if args.endpoint is not None:  # no torch: the endpoint runs the model (engine/remote/)
        from engine.remote.run_command import check_args, run_remote

        check_args(args)
        return run_remote(args, _requests(args)[1])
    from engine.files.model_folder import check
    from engine.parallel import request as tp_request

    load, gen = _requests(args)
    folder = check(load.model)  # before torch: a bad folder fails in well under a second
    if load.draft is not None:
        check(load.draft)
    tp_request.check(load, folder.path)  # so does a split the model or the machine cannot take

    def show(event) -> None:
        if args.json:
            print(event_to_json(event), flush=True)
        elif isinstance(event, LoadProgress) and event.message:
            print(f"[{event.done + 1}/{event.total}] {event.message}", file=sys.stderr)
        elif isinstance(event, Loaded):
            print(f"loaded {event.architecture} as {event.quant} on {event.device}, "
                  f"context {event.context}", file=sys.stderr)
        elif isinstance(event, Token):
            print(event.text, end="", flush=True)
        elif isinstance(event, Finished):
            s = event.stats
            if s.dropped_messages:
                print(f"\nnote: the conversation outgrew the context; its oldest "
                      f"{s.dropped_messages} message(s) after the system prompt were left out",
                      file=sys.stderr)
            print(f"\n[{event.reason}] {s.new_tokens} tokens, ttft {s.ttft_ms:.0f} ms, "
                  f"{s.decode_tokens_per_s:.1f} tokens/s{_speculation(s)}", file=sys.stderr)

    if load.tensor_parallel > 1:
        from engine.parallel.session import TPSession as Session
    else:
        from engine.generate.session import Session

    session = Session.load(load, show)
    try:
        show(session.loaded_event())
        last = None
        for event in session.generate(gen):
            show(event)
            last = event
    finally:
        if load.tensor_parallel > 1:
            session.close()  # the follower processes end with the command
    if isinstance(last, Failed):
        if not args.json:
            print(f"hearth: {last.error}" + (f" ({last.hint})" if last.hint else ""),
                  file=sys.stderr)
        return EXIT_BAD_INPUT if last.bad_input else EXIT_ERROR
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
