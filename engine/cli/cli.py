"""The `hearth` command. Arguments and the model folder are checked before torch is imported,
so bad input fails at once with one sentence and exit code 2 (the CLI contract).
The argument tree is cli/arguments.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

from engine.cli import chat_cli, import_cli, models_cli
from engine.cli.arguments import build_parser
from engine.config import overrides
from engine.events import (
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
from engine.generate.reproducible import reproducible_of

EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT = 0, 1, 2


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        _fill_default_model(args)
        if args.command in (None, "gui"):
            from engine.platform import display
            from engine.platform.child_env import child_env

            if not display.has_display():  # Qt would abort with its own message
                raise BadRequest(display.NO_DISPLAY)

            model = getattr(args, "model", None)  # `hearth` alone has no gui options
            if model is not None:
                from engine.files.model_folder import check

                check(model)  # a bad folder: one sentence here, not a failed load in the window
            app_args = ["--model", model] if model is not None else []
            code = subprocess.call([sys.executable, "-m", "app", *app_args], env=child_env())
            if code < 0:  # a signal: Qt aborts where its platform plugin cannot load
                print(f"hearth: {display.window_failure(-code)}", file=sys.stderr)
                return EXIT_ERROR
            return code
        if args.command == "worker":
            from engine.cli import worker

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
            if args.concurrency is not None:
                from engine.tools.bench import concurrent

                return concurrent.run_cli(args)
            if args.repeats is not None:
                raise BadRequest("--repeats goes with --concurrency (the batch-1 bench takes "
                                 "the median of 3)")
            from engine.tools.bench import decode as bench

            return bench.run_cli(args)
        if args.command == "eval":
            from engine.tools.eval import run_eval

            return run_eval(args.model, args.text, args.quant, args.kv_dtype, args.json,
                            lm_head=args.lm_head)
        if args.command == "quantize":
            from engine.tools.quantize import run_quantize

            return run_quantize(args.model, args.method, args.out, args.calibration, args.device,
                                args.num_samples, args.seq_len, args.group_size)
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
        if args.command == "list":
            return models_cli.run_list(args)
        if args.command == "pull":
            return models_cli.run_pull(args)
        if args.command == "serve":
            from engine.server import command as serve_command

            return serve_command.run(args)
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
        if overrides.debug():
            raise
        print(f"hearth: error: {type(e).__name__}: {_one_line(e)} (set HEARTH_DEBUG=1 for "
              "details)", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_ERROR


# the commands that load or read a local model; `hearth gui` leaves the choice to the window,
# which makes the same one (app/__main__.py)
LOCAL_MODEL_COMMANDS = ("run", "chat", "serve", "plan", "bench", "eval", "quantize")


def _fill_default_model(args) -> None:
    """No --model: the model every front end loads by default (model_home.default_model: the
    starter model once imported, else the bundled demo model); not for an endpoint, whose
    --model is its own model id."""
    if (args.command in LOCAL_MODEL_COMMANDS and args.model is None
            and getattr(args, "endpoint", None) is None):
        from engine.files.model_home import default_model

        args.model = default_model()


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


def _grammar(args):
    if getattr(args, "json_schema", None) is None:
        return None
    if args.endpoint is not None:
        raise BadRequest("--json-schema holds a local model to a schema; leave out --endpoint")
    from engine.cli import schema_file

    return schema_file.read(args.json_schema)


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
    elif not args.prompt.strip():
        raise BadRequest("--prompt is empty; give the text to answer")
    load = LoadRequest(model=args.model, quant=args.quant, kv_dtype=args.kv_dtype,
                       context=args.context, device=args.device,
                       memory_limit_gib=args.memory_limit, draft=args.draft,
                       num_speculative_tokens=args.num_speculative_tokens,
                       tensor_parallel=args.tensor_parallel, lm_head=args.lm_head,
                       reproducible=reproducible_of(args))
    gen = GenerateRequest(prompt=args.prompt, messages=messages, system=args.system,
                          raw=args.raw, max_new_tokens=args.max_new_tokens, stop=tuple(args.stop),
                          sampling=SamplingParams(args.temperature, args.top_p, args.top_k,
                                                  args.repetition_penalty, args.seed,
                                                  logprobs=_logprobs(args)),
                          prompt_lookup=args.prompt_lookup, stop_on_repetition=True,
                          grammar=_grammar(args))
    load.validate()
    gen.validate()
    return load, gen


def _logprobs(args) -> int | None:
    """--logprobs, shown in --json's token events, from the local engine."""
    if args.logprobs is not None and (not args.json or args.endpoint is not None):
        raise BadRequest("--logprobs shows in the token events of --json, from a local model; "
                         "add --json" + (" and leave out --endpoint" if args.endpoint else ""))
    return args.logprobs


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
