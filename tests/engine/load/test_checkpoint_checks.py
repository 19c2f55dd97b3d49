"""What transformers would paper over in a model folder, refused as bad input: a weight no
.safetensors file holds (filled at random under a warning table), a RoPE type it has no function
for (a KeyError), a sliding window below one token (the arena's ValueError). Each is exit 2 with
one sentence on stderr; and a prompt longer than the context gets Hearth's sentence alone, with
no transformers warning before it (a real process: what a user's terminal shows)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cli import cli
from tests.engine.helpers import REPO


def _copy(tiny_model: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_model, tmp_path / "model"))


def _without(folder: Path, name: str) -> Path:
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(path)
    del tensors[name]
    save_file(tensors, path, metadata={"format": "pt"})
    return folder


def _config(folder: Path, **changes) -> Path:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


MISSING = "model.layers.1.mlp.down_proj.weight"
# case -> (change the folder, words of the one line)
CASES = {
    "a weight is missing": (lambda d: _without(d, MISSING), f"lacks the weight {MISSING}"),
    "an unknown rope type": (lambda d: _config(d, rope_scaling={"type": "evil"}),
                             'rope_scaling of type "evil"'),
    "a negative sliding window": (lambda d: _config(d, sliding_window=-1,
                                                    use_sliding_window=True),
                                  "sliding_window = -1"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_folder_transformers_would_patch_up_exits_2(case, tiny_model, tmp_path, capsys):
    change, words = CASES[case]
    folder = change(_copy(tiny_model, tmp_path))
    rc = cli.main(["run", "--model", str(folder), "--device", "cpu", "--prompt", "hi",
                   "--max-new-tokens", "2", "--json"])  # --json: progress goes to stdout
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("hearth: ") and words in lines[0], lines[0]


def test_a_rope_type_transformers_knows_still_loads(tiny_model, tmp_path, capsys):
    folder = _config(_copy(tiny_model, tmp_path), rope_scaling={"type": "linear", "factor": 2.0})
    assert cli.main(["run", "--model", str(folder), "--device", "cpu", "--prompt", "hi",
                     "--max-new-tokens", "2", "--json"]) == 0, capsys.readouterr().err


def _hearth_run(folder: Path, prompt: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine.cli.cli", "run", "--model",
                           str(folder), "--device", "cpu", "--prompt", prompt,
                           "--max-new-tokens", "2"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("case", ["an over-long prompt", "a weight is missing"])
def test_hearths_sentence_comes_alone(case, tiny_model, tmp_path):
    """stderr holds Hearth's progress lines and its one sentence, nothing of transformers'."""
    folder = _copy(tiny_model, tmp_path)
    if case == "a weight is missing":
        _without(folder, MISSING)
    # the tiny tokenizer's model_max_length is its 2,048 positions: this is ~7,500 tokens
    proc = _hearth_run(folder, "hello world " * 1500 if case == "an over-long prompt" else "hi")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    ours = [line for line in lines
            if re.match(r"\[\d+/\d+\] ", line) or line.startswith(("loaded ", "hearth: "))]
    assert ours == lines, proc.stderr
    assert [line for line in lines if line.startswith("hearth: ")] == [lines[-1]]
    assert ("the prompt has" if case == "an over-long prompt" else MISSING) in lines[-1]
