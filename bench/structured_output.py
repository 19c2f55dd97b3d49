"""Structured output and tool calls held by the grammar, counted through a real `hearth serve`:
N requests over five JSON schemas (engine/tools/bench/structured.py: nested objects, arrays,
enums, required fields, bounded numbers) and M under tool_choice required and named, each
answer checked with jsonschema; prints a table per schema and per choice.

    python bench/structured_output.py MODEL_FOLDER [--schemas 50] [--tools 20] [--max-tokens 512]
        [--tool-max-tokens 512]
    python bench/structured_output.py MODEL_FOLDER --random   # its tokenizer, random weights

--random serves a model of MODEL_FOLDER's tokenizer and architecture with random weights (2
small layers, seeded), where output without the grammar is almost never valid.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from engine.tools.bench import structured

TOKENIZER_FILES = ("tokenizer", "special_tokens", "vocab", "merges", "chat_template")


def random_folder(src: Path, dest: Path) -> Path:
    """src's tokenizer and architecture, 2 layers of width 64, random weights (seed 0)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(src)
    config.update({"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest, safe_serialization=True)
    for f in src.iterdir():
        if f.name.startswith(TOKENIZER_FILES):
            shutil.copy2(f, dest / f.name)
    return dest


def serve(folder: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli.cli", "serve", "--model",
                             str(folder), "--port", "0", "--device", "cpu"],
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if line.startswith("serving on "):
            return proc, line.split()[-1]
    proc.kill()
    raise SystemExit("hearth serve did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--random", action="store_true")
    ap.add_argument("--schemas", type=int, default=50)
    ap.add_argument("--tools", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--tool-max-tokens", type=int, default=512)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--json", type=Path, help="also write every answer here")
    a = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="hearth-structured-"))
    folder = random_folder(a.model, scratch / "random") if a.random else a.model
    proc, url = serve(folder)
    print(f"{a.model.name + ' (random weights)' if a.random else folder.name}, max_tokens "
          f"{a.max_tokens} (tools {a.tool_max_tokens}), temperature {a.temperature}\n",
          flush=True)
    try:
        schemas = structured.run_schemas(url, a.schemas, a.max_tokens, a.temperature)
        print(structured.table(schemas, "schema"), "\n", flush=True)  # before the tools run
        tools = structured.run_tools(url, a.tools, a.tool_max_tokens, a.temperature)
        print(structured.table(tools, "choice"))
    finally:
        proc.terminate()
        proc.wait(60)
        shutil.rmtree(scratch, ignore_errors=True)
    if a.json:
        a.json.write_text(json.dumps({"schemas": schemas, "tools": tools}, indent=1))


if __name__ == "__main__":
    main()
