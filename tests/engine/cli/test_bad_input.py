"""Bad input: one clear sentence on stderr and exit code 2, never a traceback; the worker
answers the same cases with a Failed event and stays alive."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.cli import cli
from tests.engine.helpers import REPO, WorkerProcess

FOLDER_CASES = {
    "missing": "neither a folder",
    "no_config": "no config.json",
    "unsupported_arch": "MambaForCausalLM is not supported",
    "gguf": "GGUF",
    "gguf_file": "safetensors",
    "no_weights": "no .safetensors",
    "bin_only": "pickle",
    "truncated": "truncated",
    "corrupt_header": "corrupt",
    "no_tokenizer": "no tokenizer",
    "bad_config_json": "not valid JSON",
}


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("case", sorted(FOLDER_CASES))
def test_bad_model_folder(case, bad_models, capsys):
    rc = cli.main(["run", "--model", str(bad_models[case]), "--prompt", "hi"])
    assert rc == 2
    assert FOLDER_CASES[case] in one_error_line(capsys)


@pytest.mark.parametrize("flags, words", [
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "0"], "top-p"),
    (["--top-p", "1.5"], "top-p"),
    (["--max-new-tokens", "0"], "max new tokens"),
    (["--top-k", "-3"], "top-k"),
    (["--quant", "q5"], "--quant"),
    (["--kv-dtype", "int3"], "--kv-dtype"),
    (["--context", "4"], "context"),
    (["--temperature", "warm"], "invalid float"),
    (["--seed", "-1"], "--seed"),
    (["--seed", str(2**70)], "--seed"),
    (["--top-k", str(10**30)], "--top-k"),
    (["--temperature", "inf"], "finite"),
    (["--temperature", "nan"], "finite"),
    (["--repetition-penalty", "inf"], "finite"),
    (["--memory-limit", "inf"], "finite"),
])
def test_impossible_settings(flags, words, tiny_model, capsys):
    assert cli.main(["run", "--model", str(tiny_model), "--prompt", "hi", *flags]) == 2
    assert words in one_error_line(capsys)


def test_missing_prompt_and_bad_messages_file(tiny_model, tmp_path, capsys):
    assert cli.main(["run", "--model", str(tiny_model)]) == 2
    assert "--prompt" in one_error_line(capsys)
    bad = tmp_path / "m.json"
    bad.write_text("{not json")
    assert cli.main(["run", "--model", str(tiny_model), "--messages", str(bad)]) == 2
    assert "cannot read messages" in one_error_line(capsys)


@pytest.mark.parametrize("flag", ["--prompt", "--system", "--stop"])
def test_invalid_utf8_in_arguments(flag, tiny_model, capsys):
    """argv bytes that are not UTF-8 arrive as lone surrogates (surrogateescape)."""
    bad = b"caf\xe9".decode("utf-8", "surrogateescape")
    argv = ["run", "--model", str(tiny_model), "--device", "cpu", "--prompt", "hi", flag, bad]
    assert cli.main(argv) == 2
    assert f"{flag} is not valid UTF-8" in one_error_line(capsys)


@pytest.mark.parametrize("content, words", [
    (b'[{"role": "user", "content": "\\ud800"}]', "not valid Unicode"),
    ('[{"role": "user", "content": "café"}]'.encode("latin-1"), "not UTF-8"),
    (b"[" * 100_000, "nested too deeply"),
])
def test_unreadable_messages_files(content, words, tiny_model, tmp_path, capsys):
    path = tmp_path / "messages.json"
    path.write_bytes(content)
    assert cli.main(["run", "--model", str(tiny_model), "--device", "cpu", "--messages",
                     str(path)]) == 2
    line = one_error_line(capsys)
    assert words in line and str(path) in line


@pytest.mark.parametrize("template, words", [
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "SecurityError"),
    ("{{ raise_exception('roles must alternate user/assistant') }}", "roles must alternate"),
])
def test_chat_templates_that_fail_are_bad_input(template, words, tiny_model, tmp_path, capsys):
    """The sandbox blocks it, or it raises: exit 2 naming the template, not exit 1."""
    import shutil

    d = tmp_path / "model"
    shutil.copytree(tiny_model, d)
    (d / "chat_template.jinja").write_text(template)
    rc = cli.main(["run", "--model", str(d), "--device", "cpu", "--prompt", "hi",
                   "--max-new-tokens", "2"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2, last
    assert "chat template" in last and words in last and "generation failed" not in last


def test_nf4_on_the_cpu_says_it_is_slow(tiny_model, capsys):
    """Accepted (bitsandbytes runs 4-bit on the CPU), with a one-line note that it is slow."""
    rc = cli.main(["run", "--model", str(tiny_model), "--device", "cpu", "--quant", "nf4",
                   "--prompt", "hi", "--raw", "--max-new-tokens", "2", "--temperature", "0"])
    err = capsys.readouterr().err
    assert rc == 0, err
    notes = [line for line in err.splitlines() if "nf4 on the CPU is slower" in line]
    assert len(notes) == 1, err


@pytest.mark.parametrize("case", ["missing", "gguf", "truncated"])
def test_real_subprocess_fails_fast_without_importing_torch(case, bad_models):
    code = ("import sys; from engine.cli import cli; rc = cli.main(sys.argv[1:]); "
            "assert 'torch' not in sys.modules, 'torch was imported'; sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, "run", "--model", str(bad_models[case]),
                           "--prompt", "hi"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_hearth_entry_point_bad_input(bad_models):
    proc = subprocess.run([sys.executable, "-m", "engine.cli.cli", "run", "--model",
                           str(bad_models["bin_only"]), "--prompt", "hi"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("hearth: ") and "pickle" in proc.stderr


def test_worker_answers_bad_input_and_stays_alive(bad_models, tiny_model):
    worker = WorkerProcess()
    try:
        for case in ("missing", "gguf", "bin_only", "truncated", "unsupported_arch"):
            worker.send(command="load", model=str(bad_models[case]), device="cpu")
            events = worker.stream()
            assert [e.name for e in events][-1] == "failed" and events[-1].bad_input
        worker.proc.stdin.write("this is not json\n")
        worker.proc.stdin.flush()
        assert worker.stream()[-1].name == "failed"
        worker.send(command="generate", prompt="hi", raw=True)
        assert "no model" in worker.stream()[-1].error
        worker.send(command="load", model=str(tiny_model), device="cpu")
        assert worker.stream()[-1].name == "loaded"
        worker.send(command="generate", prompt="hi", raw=True, max_new_tokens=0)
        assert "max new tokens" in worker.stream()[-1].error
        worker.send(command="generate", prompt="hi", raw=True, max_new_tokens=4,
                    sampling={"temperature": 0})
        assert worker.stream()[-1].name == "finished"
    finally:
        assert worker.close() == 0


def test_worker_cancel_lands_between_steps(tiny_model):
    worker = WorkerProcess()
    try:
        worker.send(command="load", model=str(tiny_model), device="cpu")
        assert worker.stream()[-1].name == "loaded"
        worker.send(command="generate", prompt="hi", raw=True, max_new_tokens=1500,
                    sampling={"temperature": 0})
        first = worker.next_event()
        assert first.name in ("token", "stats")
        worker.send(command="cancel")
        events = worker.stream()
        assert events[-1].name == "finished" and events[-1].reason == "cancelled"
        assert events[-1].stats.new_tokens < 1500
    finally:
        assert worker.close() == 0
