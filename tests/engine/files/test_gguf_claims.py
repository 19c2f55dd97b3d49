"""`hearth import` holds a GGUF header's claims against the file: every tensor the architecture
needs at the shape the header's sizes imply, sizes that are whole and bounded, a tokenizer inside
its token list. Each hostile file exits 2 with one sentence on stderr (progress goes to stdout
with --json) before anything is dequantized; a complete file imports with Hearth's own progress
lines only; a killed import's hidden work folder is removed by the next import or scan."""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cli import cli
from engine.files import gguf_import, model_home
from tests.fixtures import tiny_gguf

LAYER_0 = [n for n in tiny_gguf.tensor_shapes() if n.startswith("blk.0.")]


@pytest.fixture
def models_home(tmp_path, monkeypatch):
    home = tmp_path / "models"
    monkeypatch.setenv("HEARTH_MODELS_DIR", str(home))
    return home


def _proc_mem(path: Path) -> Path:
    path.symlink_to("/proc/self/mem")
    return path


def _array_claims(path: Path, key: str, count: int) -> Path:
    """The file with the metadata array `key` claiming `count` items (its data unchanged)."""
    tiny_gguf.write(path)
    data = bytearray(path.read_bytes())
    at = data.index(key.encode()) + len(key) + 8  # past the value type and the item type
    data[at:at + 8] = struct.pack("<Q", count)
    path.write_bytes(bytes(data))
    return path


def _keep_only(names: set[str]) -> tuple[str, ...]:
    return tuple(n for n in tiny_gguf.tensor_shapes() if n not in names)


# case -> (make the file in a folder, words the one line on stderr holds)
CASES = {
    "most tensors missing": (lambda p: tiny_gguf.write(p, drop=_keep_only(
        {"token_embd.weight", "output_norm.weight", "blk.0.attn_norm.weight"})),
        "lacks tensor blk.0.attn_output.weight"),
    "one weight missing": (lambda p: tiny_gguf.write(p, drop=("blk.1.ffn_down.weight",)),
                           "lacks tensor blk.1.ffn_down.weight"),
    "a layer's shape differs": (lambda p: tiny_gguf.write(
        p, shapes={"blk.0.attn_k.weight": (16, 16)}),
        "tensor blk.0.attn_k.weight is [16, 16] but the header's sizes make it [16, 8]"),
    "a million layers": (lambda p: tiny_gguf.write(p, block_count=1_000_000),
                         "llama.block_count = 1,000,000"),
    "more layers than tensors": (lambda p: tiny_gguf.write(p, block_count=300),
                                 "lacks tensor blk.2.attn_norm.weight"),
    "embedding length zero": (lambda p: tiny_gguf.write(p, embedding_length=0),
                              "llama.embedding_length = 0"),
    "heads do not divide": (lambda p: tiny_gguf.write(p, head_count=3),
                            "3 attention heads do not divide"),
    "eos id past the tokens": (lambda p: tiny_gguf.write(p, eos_token_id=2**31),
                               "eos_token_id = 2,147,483,648 is past its 15 tokens"),
    "merges past the tokens": (lambda p: tiny_gguf.write(p, tokens=tiny_gguf.TOKENS[:11]),
                               "BPE merge 1 ('c d') is not made of tokens"),
    "link to /proc/self/mem": (_proc_mem, "is not a GGUF file"),
    "a token list past the file": (lambda p: _array_claims(p, "tokenizer.ggml.tokens", 2**40),
                                   "damaged or truncated"),
    "a merge list past the file": (lambda p: _array_claims(p, "tokenizer.ggml.merges", 2**62),
                                   "damaged or truncated"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_claim_the_file_cannot_back_exits_2_in_one_line(case, tmp_path, models_home, capsys):
    make, words = CASES[case]
    path = make(tmp_path / "hostile.gguf")
    assert cli.main(["import", str(path), "--json"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"hearth: {path}") and words in lines[0], lines[0]
    assert not models_home.exists() or not any(models_home.iterdir())


def test_a_complete_file_imports_with_hearth_progress_lines_only(tmp_path, capsys):
    """The progress of a real import is Hearth's [n/4] lines: no third-party bar on stderr."""
    out = tmp_path / "tiny"
    assert cli.main(["import", str(tiny_gguf.write(tmp_path / "tiny.gguf")), "--out",
                     str(out)]) == 0
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 4 and all(re.match(r"\[\d/4\] \w", line) for line in lines), \
        captured.err
    assert captured.out.startswith(f"imported tiny.gguf into {out}")
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()


def test_a_weight_transformers_leaves_out_is_refused_after_reading(tmp_path, monkeypatch,
                                                                   capsys):
    """Beyond the families' tensor lists: a weight transformers reports missing fails too."""
    from engine.files import gguf_layout

    monkeypatch.setattr(gguf_layout, "check", lambda *args: None)
    path = tiny_gguf.write(tmp_path / "t.gguf", drop=("blk.1.ffn_down.weight",))
    assert cli.main(["import", str(path), "--out", str(tmp_path / "out"), "--json"]) == 2
    line = capsys.readouterr().err.strip()
    assert "lacks the weight model.layers.1.mlp.down_proj.weight" in line, line
    assert not (tmp_path / "out").exists()


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _work_folder(root: Path, pid: int | str) -> Path:
    folder = root / f".tiny{model_home.WORK_MARK}{pid}-abc123"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"\0" * 64)
    return folder


def test_the_next_import_removes_a_killed_imports_folder(tmp_path, models_home, capsys):
    dead = _work_folder(models_home, _dead_pid())
    running = _work_folder(models_home, os.getpid())  # an import still under way
    assert cli.main(["import", str(tiny_gguf.write(tmp_path / "next.gguf"))]) == 0
    assert not dead.exists()
    assert running.exists()
    assert [p.name for p in model_home.imported_models()] == ["next"]


def test_scanning_the_models_folder_removes_a_killed_imports_folder(models_home):
    """The app lists Hearth's models through imported_models() at start."""
    dead = _work_folder(models_home, _dead_pid())
    nameless = _work_folder(models_home, "old")  # no pid in its name, and recent: kept
    running = _work_folder(models_home, os.getpid())
    assert model_home.imported_models() == []
    assert not dead.exists() and nameless.exists() and running.exists()


def test_an_imports_work_folder_names_its_process(tmp_path, models_home, monkeypatch):
    seen = []

    def save(model, tokenizer, summary, work):
        seen.append(work.name)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf_import, "_tokenizer", lambda s: object())
    monkeypatch.setattr(gguf_import, "_model", lambda s: object())
    monkeypatch.setattr(gguf_import, "_save", save)
    with pytest.raises(OSError):
        gguf_import.import_gguf(tiny_gguf.write(tmp_path / "w.gguf"), None, lambda e: None)
    assert seen and seen[0].startswith(f".w{model_home.WORK_MARK}{os.getpid()}-")
