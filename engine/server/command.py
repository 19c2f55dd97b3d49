"""`hearth serve`: its arguments, and the run that checks them, binds, loads the model with a
progress line per stage and serves until SIGINT or SIGTERM. Importing this module imports
neither torch nor the server's libraries, so the `hearth` parser stays fast and lean.
"""

from __future__ import annotations

import math
import os
import sys

from engine.config.engine_config import MAX_SEQS
from engine.events import BadRequest, Failed, Loaded, LoadProgress, LoadRequest
from engine.generate.reproducible import WORDS, reproducible_of
from engine.server.connections import IDLE_TIMEOUT_S, STALL_TIMEOUT_S, Timeouts

KEY_ENV = "HEARTH_SERVER_API_KEY"  # the key without putting it in argv, which `ps` shows


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="a local OpenAI-compatible server (needs hearth[server])")
    p.add_argument("--model", help="a model folder, a name in Hearth's models folder (`hearth "
                   "list`) or a cached Hugging Face repo id (default: the starter model once "
                   "imported, else the bundled demo model)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind; any other than "
                   "loopback needs --api-key")
    p.add_argument("--port", type=int, default=8000, help="0: any free port")
    p.add_argument("--api-key", metavar="KEY", help=f"clients must send it as a Bearer token "
                   f"(or set {KEY_ENV})")
    p.add_argument("--max-seqs", type=int, default=MAX_SEQS, metavar="N",
                   help="requests that run together in one batch (the rest wait their turn)")
    p.add_argument("--kv-tokens", type=int, metavar="N", help="tokens the KV cache holds for "
                   "every request together (default: one context's worth; on a GPU at most "
                   "what fits)")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="allow browser pages from this origin (repeat for more); off by default")
    p.add_argument("--stall-timeout", type=float, default=STALL_TIMEOUT_S, metavar="S",
                   help="cancel an answer whose client reads none of it for S seconds, and "
                        "close its connection (its place in the batch goes to others)")
    p.add_argument("--idle-timeout", type=float, default=IDLE_TIMEOUT_S, metavar="S",
                   help="close a connection that sends no whole request for S seconds (idle "
                        "or half-open)")
    p.add_argument("--quant", default="auto")
    p.add_argument("--kv-dtype", default="auto")
    p.add_argument("--context", type=int)
    p.add_argument("--device", default="auto")
    p.add_argument("--memory-limit", type=float, metavar="GIB")
    p.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                   help="cut the model across N GPUs (with --device cpu: N CPU processes); "
                        "requests batch as on one device")
    p.add_argument("--reproducible", choices=tuple(WORDS), default="auto",
                   help="greedy answers that do not change with how they were computed (batch "
                        "company, warm or cold cache, chunk sizes); auto: the device's default")


def check_args(args) -> tuple[str | None, LoadRequest]:
    """Everything that can be wrong with the flags, before torch: -> (key, load request)."""
    from engine.server.guards import is_loopback

    key = args.api_key or os.environ.get(KEY_ENV) or None
    if not 0 <= args.port <= 65535:
        raise BadRequest(f"--port must be 0 to 65535, got {args.port}")
    if args.max_seqs < 1:
        raise BadRequest(f"--max-seqs must be at least 1, got {args.max_seqs}")
    for flag, value in (("--stall-timeout", args.stall_timeout),
                        ("--idle-timeout", args.idle_timeout)):
        if not (math.isfinite(value) and value > 0):
            raise BadRequest(f"{flag} must be a number of seconds above 0, got {value}")
    if not is_loopback(args.host) and not key:
        raise BadRequest(f"binding {args.host} opens the server to other machines; give an "
                         f"--api-key (or set {KEY_ENV}), or bind 127.0.0.1")
    for origin in args.cors_origin:
        if origin != "*" and not origin.startswith(("http://", "https://")):
            raise BadRequest(f"--cors-origin takes an origin such as http://localhost:3000, "
                             f"got {origin[:80]!r}")
    load = LoadRequest(model=args.model, quant=args.quant, kv_dtype=args.kv_dtype,
                       context=args.context, device=args.device,
                       memory_limit_gib=args.memory_limit, kv_tokens=args.kv_tokens,
                       tensor_parallel=args.tensor_parallel, reproducible=reproducible_of(args))
    load.validate()
    return key, load


def _show(event) -> None:
    if isinstance(event, LoadProgress) and event.message:
        print(f"[{event.done + 1}/{event.total}] {event.message}", file=sys.stderr, flush=True)
    elif isinstance(event, Loaded):
        print(f"loaded {event.architecture} as {event.quant} on {event.device}, context "
              f"{event.context}", file=sys.stderr, flush=True)


def load(engine, req: LoadRequest):
    """Load on the engine thread, showing progress; -> the terminal event."""
    from engine.service import start

    return start.load(engine, req, _show)


def run(args) -> int:
    # first: checking the flags imports the server's own modules, which import FastAPI
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        from engine.tools.pip_packages import extra_install

        raise BadRequest(f"the server extra is not installed ({e.name} is missing); "
                         f"add it with: {extra_install('server')}") from None
    key, req = check_args(args)
    from engine.files.model_folder import check
    from engine.server.app import Settings, create_app
    from engine.server.model_view import ModelView
    from engine.server.runner import bind, make_server
    from engine.service import start

    folder = check(req.model)  # a bad folder fails before anything is bound or loaded
    if req.tensor_parallel != 1:  # the cut and the GPUs, before torch (as for `run`)
        from engine.parallel import request as tp_request

        tp_request.check(req, folder.path)
    sock = bind(args.host, args.port)
    engine, thread = start.start("hearth-engine", args.max_seqs)
    try:
        result = load(engine, req)
        if not isinstance(result, Loaded):
            sock.close()
            if isinstance(result, Failed):
                hint = f" ({result.hint})" if result.hint else ""
                print(f"hearth: {result.error}{hint}", file=sys.stderr)
                return 2 if result.bad_input else 1
            return 130  # cancelled
        print(f"up to {args.max_seqs} requests run together (--max-seqs)", file=sys.stderr,
              flush=True)
        settings = Settings(args.host, sock.getsockname()[1], key, tuple(args.cors_origin),
                            timeouts=Timeouts(args.stall_timeout, args.idle_timeout))
        app = create_app(engine, ModelView.of(engine.session, args.model), settings)
        make_server(app, engine).run(sockets=[sock])
    finally:
        engine.stop()
        thread.join(10)
    return 0

