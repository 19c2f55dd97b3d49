"""Hostile model folders: each is refused by `hearth run` and, where it reads
the file, `hearth plan`, with exit 2 and exactly one line on stderr naming the file and the
problem, within a few seconds; a FIFO named model.safetensors must not hang."""

from __future__ import annotations

import json
import os
import shutil
import struct
import threading
from pathlib import Path

import pytest

from engine.cli import cli

# case -> (words the message holds, the file it names, does `hearth plan` read that file)
CASES = {
    "layers_zero": ("num_hidden_layers = 0", "config.json", True),
    "vocab_huge": ("vocab_size = 1,000,000,000,000", "config.json", True),
    "kv_heads_do_not_divide": ("KV heads must divide", "config.json", True),
    "hidden_not_divided_by_heads": ("do not divide", "config.json", True),
    "negative_size": ("intermediate_size = -128", "config.json", True),
    "non_numeric_size": ('hidden_size = "64"', "config.json", True),
    "max_positions_not_a_number": ('max_position_embeddings = "lots"', "config.json", True),
    "layers_disagree_with_weights": ("the weights hold 2 layers", "config.json", False),
    "architectures_not_names": ("architectures = [5]", "config.json", False),
    "config_is_a_folder": ("is a folder", "config.json", True),
    "config_invalid_utf8": ("not valid UTF-8", "config.json", True),
    "config_nested_deeply": ("nested too deeply", "config.json", True),
    "unknown_dtype": ('unknown dtype "Q7"', "model.safetensors", True),
    "negative_offsets": ("data offsets [-8", "model.safetensors", True),
    "shape_larger_than_data": ("needs", "model.safetensors", True),
    "weights_are_a_folder": ("is a folder", "model.safetensors", True),
    "tokenizer_truncated": ("not valid JSON", "tokenizer.json", False),
    "tokenizer_malformed": ("vocabulary is not a table", "tokenizer.json", False),
    "tokenizer_remote_code": ("remote code", "tokenizer_config.json", False),
    "template_does_not_parse": ("does not parse", "chat_template.jinja", False),
    "temperature_hot": ('temperature = "hot"', "generation_config.json", False),
    "temperature_negative": ("temperature = -1", "generation_config.json", False),
    "top_p_five": ("top_p = 5", "generation_config.json", False),
}


def _edit_json(folder: Path, name: str, **changes) -> None:
    obj = json.loads((folder / name).read_text())
    obj.update(changes)
    (folder / name).write_text(json.dumps(obj))


def _edit_header(folder: Path, edit) -> None:
    """Rewrite model.safetensors with `edit(header)` applied and the same data after it."""
    path = folder / "model.safetensors"
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    edit(header, next(k for k in header if k.endswith("embed_tokens.weight")))
    new = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])


def _build(case: str, d: Path) -> None:
    if case == "layers_zero":
        _edit_json(d, "config.json", num_hidden_layers=0)
    elif case == "vocab_huge":
        _edit_json(d, "config.json", vocab_size=10**12)
    elif case == "kv_heads_do_not_divide":
        _edit_json(d, "config.json", num_key_value_heads=3)
    elif case == "hidden_not_divided_by_heads":
        _edit_json(d, "config.json", num_attention_heads=6, num_key_value_heads=2)
    elif case == "negative_size":
        _edit_json(d, "config.json", intermediate_size=-128)
    elif case == "non_numeric_size":
        _edit_json(d, "config.json", hidden_size="64")
    elif case == "max_positions_not_a_number":
        _edit_json(d, "config.json", max_position_embeddings="lots")
    elif case == "layers_disagree_with_weights":  # transformers would fill layer 2 at random
        _edit_json(d, "config.json", num_hidden_layers=3, layer_types=["full_attention"] * 3)
    elif case == "architectures_not_names":
        _edit_json(d, "config.json", architectures=[5])
    elif case == "config_is_a_folder":
        (d / "config.json").unlink()
        (d / "config.json").mkdir()
    elif case == "config_invalid_utf8":
        (d / "config.json").write_bytes(b'{"architectures": ["Qwen2ForCausalLM\xff"]}')
    elif case == "config_nested_deeply":
        (d / "config.json").write_text("[" * 100_000)
    elif case == "unknown_dtype":
        _edit_header(d, lambda h, k: h[k].update(dtype="Q7"))
    elif case == "negative_offsets":
        _edit_header(d, lambda h, k: h[k].update(data_offsets=[-8, h[k]["data_offsets"][1]]))
    elif case == "shape_larger_than_data":
        _edit_header(d, lambda h, k: h[k].update(shape=[h[k]["shape"][0] * 1000,
                                                         h[k]["shape"][1]]))
    elif case == "weights_are_a_folder":
        (d / "model.safetensors").unlink()
        (d / "model.safetensors").mkdir()
    elif case == "tokenizer_truncated":
        text = (d / "tokenizer.json").read_text()
        (d / "tokenizer.json").write_text(text[: len(text) // 2])
    elif case == "tokenizer_malformed":
        _edit_json(d, "tokenizer.json", model={"type": "BPE", "vocab": ["a", "b"], "merges": []})
    elif case == "tokenizer_remote_code":
        _edit_json(d, "tokenizer_config.json",
                   auto_map={"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]})
    elif case == "template_does_not_parse":
        (d / "chat_template.jinja").write_text("{% for message in messages %}{{ message")
    elif case == "temperature_hot":
        _edit_json(d, "generation_config.json", do_sample=True, temperature="hot")
    elif case == "temperature_negative":
        _edit_json(d, "generation_config.json", do_sample=True, temperature=-1)
    elif case == "top_p_five":
        _edit_json(d, "generation_config.json", do_sample=True, top_p=5)
    else:
        raise AssertionError(case)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, tiny_model) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hostile")
    out = {}
    for case in CASES:
        out[case] = root / case
        shutil.copytree(tiny_model, out[case])
        _build(case, out[case])
    return out


def _one_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    return lines[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_run_refuses_in_one_line(case, hostile, capsys):
    words, name, _ = CASES[case]
    rc = cli.main(["run", "--model", str(hostile[case]), "--device", "cpu", "--prompt", "hi",
                   "--max-new-tokens", "2"])
    line = _one_line(capsys)
    assert rc == 2, line
    assert name in line and words in line, line


@pytest.mark.parametrize("case", sorted(c for c, (_, _, plan) in CASES.items() if plan))
def test_plan_refuses_in_one_line(case, hostile, capsys):
    words, name, _ = CASES[case]
    assert cli.main(["plan", "--model", str(hostile[case])]) == 2
    line = _one_line(capsys)
    assert name in line and words in line, line


def test_config_without_permission(hostile, tiny_model, tmp_path, capsys):
    if os.geteuid() == 0:
        pytest.skip("root reads any file: the folder and invalid-UTF-8 cases stand in for it")
    d = tmp_path / "locked"
    shutil.copytree(tiny_model, d)
    (d / "config.json").chmod(0)
    assert cli.main(["run", "--model", str(d), "--prompt", "hi"]) == 2
    assert "config.json cannot be read" in _one_line(capsys)


@pytest.mark.parametrize("command", ["run", "plan"])
def test_a_fifo_named_model_safetensors_does_not_hang(command, tiny_model, tmp_path, capsys):
    d = tmp_path / "fifo"
    shutil.copytree(tiny_model, d)
    (d / "model.safetensors").unlink()
    os.mkfifo(d / "model.safetensors")
    argv = [command, "--model", str(d)] + (["--prompt", "hi"] if command == "run" else [])
    result = []
    thread = threading.Thread(target=lambda: result.append(cli.main(argv)), daemon=True)
    thread.start()
    thread.join(timeout=10)
    if thread.is_alive():  # unblock the open() so the thread can end, then fail
        fd = os.open(d / "model.safetensors", os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        pytest.fail(f"hearth {command} hung on a FIFO named model.safetensors")
    assert result == [2]
    line = _one_line(capsys)
    assert "model.safetensors" in line and "not a regular file" in line
