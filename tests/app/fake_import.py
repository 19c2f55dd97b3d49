"""A stand-in for `python -m engine.cli.cli import FILE --json` (no torch, no dequantizing):
prints
the import's JSON lines and makes a model folder the way the engine does (a hidden work folder
renamed into place). HEARTH_FAKE_IMPORT=hang stops after stage 3, its work folder half written,
until it is killed."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

DEMO_CONFIG = (Path(__file__).resolve().parents[2] / "hearth_resources" / "demo_model"
               / "config.json")
STAGES = ("checking the GGUF file", "reading the tokenizer", "dequantizing 3 tensors to bf16",
          "writing safetensors")


def say(**event) -> None:
    print(json.dumps(event), flush=True)


def main(argv: list[str]) -> int:
    assert argv[0] == "import" and argv[2] == "--json", argv
    source = Path(argv[1])
    models = Path(os.environ["HEARTH_MODELS_DIR"])
    out = models / source.stem.rsplit(".", 1)[0]
    work = models / f".{out.name}.importing-fake"
    for done, stage in enumerate(STAGES, 1):
        say(event="load_progress", stage=stage, done=done, total=len(STAGES), message="")
        if done == 2:
            work.mkdir(parents=True)
            shutil.copy(DEMO_CONFIG, work / "config.json")
            (work / "model.safetensors.partial").write_bytes(b"\0" * 1000)  # half written
        if done == 3 and os.environ.get("HEARTH_FAKE_IMPORT") == "hang":
            time.sleep(120)  # killed long before this ends
        time.sleep(0.05)
    os.replace(work, out)
    gguf_bytes = source.stat().st_size
    say(event="imported", folder=str(out.resolve()), weights_bytes=4 * gguf_bytes,
        gguf_bytes=gguf_bytes)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
