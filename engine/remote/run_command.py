"""`hearth run --endpoint URL [--api-key KEY] --model ID`: the answer streamed from an
OpenAI-compatible endpoint, printed as `hearth run` prints a local one (and --json the same
events). Settings that shape a local load are refused: the endpoint owns its model."""

from __future__ import annotations

import os
import sys

from engine.events import BadRequest, Failed, Finished, GenerateRequest, Token, event_to_json
from engine.remote.base_url import parse_base_url
from engine.remote.client import check_api_key, check_model, stream_chat
from engine.remote.failures import RemoteError

EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT = 0, 1, 2
API_KEY_ENV = "HEARTH_API_KEY"  # a key on the command line is visible in `ps`; this is not

# flag -> (argparse attribute, its value when not given)
LOCAL_ONLY = {"--quant": ("quant", "auto"), "--kv-dtype": ("kv_dtype", "auto"),
              "--context": ("context", None), "--device": ("device", "auto"),
              "--memory-limit": ("memory_limit", None), "--tensor-parallel": ("tensor_parallel", 1),
              "--lm-head": ("lm_head", "16bit"), "--draft": ("draft", None),
              "--prompt-lookup": ("prompt_lookup", False),
              "--num-speculative-tokens": ("num_speculative_tokens", None), "--raw": ("raw", False)}


def api_key(args) -> str | None:
    return args.api_key or os.environ.get(API_KEY_ENV) or None


def check_args(args) -> None:
    """BadRequest (exit 2) before any request: the endpoint's model is named, nothing local."""
    for flag, (name, unset) in LOCAL_ONLY.items():
        if getattr(args, name, unset) != unset:
            raise BadRequest(f"{flag} shapes a local model; with --endpoint the server runs the "
                             "model as it loaded it")
    parse_base_url(args.endpoint)
    check_api_key(api_key(args))
    if not args.model:
        raise BadRequest("--endpoint needs --model ID: one of the models its /models lists")


def run_remote(args, request: GenerateRequest) -> int:
    check_args(args)
    key = api_key(args)
    where = parse_base_url(args.endpoint).where
    try:
        check_model(args.endpoint, args.model, key)
    except RemoteError as e:
        return _fail(e.failed(), args.json)
    if not args.json:
        print(f"streaming {args.model} from the endpoint at {where}", file=sys.stderr)
    last, has_text = None, False
    for event in stream_chat(args.endpoint, args.model, request, api_key=key):
        last = event
        if args.json:
            print(event_to_json(event), flush=True)
        elif isinstance(event, Token):
            print(event.text, end="", flush=True)
            has_text = has_text or bool(event.text)
        elif isinstance(event, Finished):
            s = event.stats
            print(f"\n[{event.reason}] {s.new_tokens} tokens, ttft {s.ttft_ms:.0f} ms, "
                  f"{s.decode_tokens_per_s:.1f} tokens/s (on {where})", file=sys.stderr)
    if isinstance(last, Failed):
        if has_text:
            print(flush=True)  # the partial answer stays; the message comes on its own line
        return _fail(last, args.json, printed=args.json)
    return EXIT_OK


def _fail(failed: Failed, as_json: bool, printed: bool = False) -> int:
    if as_json and not printed:
        print(event_to_json(failed), flush=True)
    elif not as_json:
        print(f"hearth: {failed.error}" + (f" ({failed.hint})" if failed.hint else ""),
              file=sys.stderr)
    return EXIT_BAD_INPUT if failed.bad_input else EXIT_ERROR
