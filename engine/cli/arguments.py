"""The `hearth` command's arguments: the argparse tree, whose own errors are one line and exit
2 like the engine's checks. The --quant and --kv-dtype words come from engine/formats, read each
time the parser is built. The commands themselves run in cli/cli.py.
"""

from __future__ import annotations

import argparse
import math
from importlib import metadata

from engine.cli import chat_cli, import_cli, models_cli
from engine.events import BadRequest, kv_dtype_choices, quant_choices
from engine.generate.reproducible import WORDS
from engine.server import command as serve_command


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: one line, exit 2, like ours
        raise BadRequest(message)


MODEL_HELP = ("a model folder, a name in Hearth's models folder (`hearth list`) or a cached "
              "Hugging Face repo id (default: the starter model once imported, else the "
              "bundled demo model)")
MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed's range
MAX_LOGPROBS = 20  # engine/events/requests.py's, OpenAI's top_logprobs bound
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


MAX_CONCURRENCY = 4096  # prompts in flight at once in one bench round


def _concurrency_list(text: str) -> tuple[int, ...]:
    """--concurrency 1,4,16,64: whole numbers, comma-separated; each one is a round's N."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        values = ()
    if not values or not all(1 <= v <= MAX_CONCURRENCY for v in values):
        raise argparse.ArgumentTypeError(
            f"must be whole numbers from 1 to {MAX_CONCURRENCY:,}, comma-separated (e.g. "
            f"1,4,16,64), got {text[:40]!r}")
    return values


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
    run.add_argument("--model", help=MODEL_HELP)
    src = run.add_mutually_exclusive_group()
    src.add_argument("--prompt")
    src.add_argument("--messages", metavar="FILE.json", help="a JSON list of chat messages")
    run.add_argument("--system")
    _load_args(run)
    spec = run.add_mutually_exclusive_group()
    spec.add_argument("--draft", metavar="PATH")
    spec.add_argument("--prompt-lookup", action="store_true",
                      help="propose tokens from n-gram matches in the prompt; greedy answers "
                           "equal plain decoding's exactly with --reproducible on, and except "
                           "where the top two choices are close without it")
    run.add_argument("--num-speculative-tokens", type=int)
    run.add_argument("--max-new-tokens", type=int, default=256)
    run.add_argument("--temperature", type=_finite)
    run.add_argument("--top-p", type=_finite)
    run.add_argument("--top-k", type=_whole(0, MAX_TOP_K))
    run.add_argument("--repetition-penalty", type=_finite)
    run.add_argument("--stop", action="extend", nargs="+", default=[], metavar="TEXT")
    run.add_argument("--seed", type=_whole(0, MAX_SEED))
    run.add_argument("--logprobs", type=_whole(0, MAX_LOGPROBS), metavar="N",
                     help="with --json: each token event carries its log probability (of the "
                     "model's raw logits) and the N likeliest tokens'")
    run.add_argument("--raw", action="store_true", help="no chat template: tokenize as is")
    run.add_argument("--json-schema", metavar="FILE", help="a JSON schema the answer follows "
                     "(a grammar holds every token to it)")
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
    plan.add_argument("--quant", choices=quant_choices(), default="auto")
    plan.add_argument("--kv-dtype", default="auto", help=_one_of(kv_dtype_choices()))
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
    bench.add_argument("--concurrency", type=_concurrency_list, metavar="N[,N...]",
                       help="submit N prompts at once to one engine, beside transformers' "
                       "generate_batch; a list sweeps (1,4,16,64)")
    bench.add_argument("--repeats", type=_whole(1, 1000), help="with --concurrency: the median "
                       "of this many rounds per N (default 3)")
    bench.add_argument("--no-peer", action="store_true", help="with --concurrency: leave out "
                       "transformers' generate_batch")
    bench.add_argument("--json", action="store_true")
    bench.add_argument("--out", metavar="FILE")

    ev = sub.add_parser("eval", help="perplexity over a text file (and, for an int8/fp8 "
                        "KV cache, top-1 agreement with the model's own cache)")
    ev.add_argument("--model", help=MODEL_HELP)
    ev.add_argument("--text", required=True, metavar="FILE")
    ev.add_argument("--quant", default="auto", help=_one_of(quant_choices()))
    ev.add_argument("--kv-dtype", default="auto", help=_one_of(kv_dtype_choices()))
    ev.add_argument("--lm-head", default="16bit", help="16bit, or a quantized copy: int8, int4")
    ev.add_argument("--json", action="store_true")

    qz = sub.add_parser("quantize", help="make a 4-bit AWQ copy of a model folder")
    qz.add_argument("--model", help=f"a bf16/fp16 model: {MODEL_HELP}")
    qz.add_argument("--method", required=True, help="awq (or rtn: plain rounding to 4 bits in "
                    "the same format, the baseline AWQ improves on)")
    qz.add_argument("--out", required=True, metavar="PATH", help="a new folder for the copy")
    qz.add_argument("--calibration", metavar="FILE", help="calibration text (paragraphs split "
                    "at blank lines; default: the Python standard library's docstrings)")
    qz.add_argument("--device", default="auto")
    qz.add_argument("--num-samples", type=int, default=128)
    qz.add_argument("--seq-len", type=int, default=512)
    qz.add_argument("--group-size", type=int, metavar="G", help="inputs per scale and zero "
                    "point: 32, 64 or 128 (default: the largest that divides the model's widths)")

    gpu = sub.add_parser("gpu", help="the GPUs NVML sees")
    gpu.add_argument("--json", action="store_true")

    sub.add_parser("doctor", help="check the Python, torch, CUDA, driver, bitsandbytes, "
                   "gptqmodel, Triton and Qt stack, and say how to fix what is missing")
    sub.add_parser("install-desktop", help="install the .desktop entry and icon for this user")
    import_cli.add_parser(sub)
    models_cli.add_parsers(sub)
    chat_cli.add_parser(sub)
    serve_command.add_parser(sub)
    return p


def _load_args(p: argparse.ArgumentParser, context: bool = True) -> None:
    p.add_argument("--quant", default="auto", help=_one_of(quant_choices()))
    p.add_argument("--kv-dtype", default="auto", help=_one_of(kv_dtype_choices()))
    if context:
        p.add_argument("--context", type=int)
    p.add_argument("--device", default="auto")
    p.add_argument("--memory-limit", type=_finite, metavar="GIB")
    p.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                   help="cut the model across N GPUs (with --device cpu: N CPU processes)")
    p.add_argument("--lm-head", default="16bit", help="16bit, or a quantized copy: int8, int4")
    p.add_argument("--reproducible", choices=tuple(WORDS), default="auto",
                   help="greedy answers that do not change with how they were computed (warm "
                        "or cold cache, speculation, chunk sizes); auto: the device's default")


def _one_of(words: tuple[str, ...]) -> str:
    """Help for a word the engine checks itself (its message names the choices on a miss)."""
    return f"one of {', '.join(words)}"
