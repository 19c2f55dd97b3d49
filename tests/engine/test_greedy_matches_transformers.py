"""The engine's greedy tokens equal transformers generate() greedy, token for token, fp32 CPU:
through the Python API, through `hearth run --json`, and through the worker process."""

from __future__ import annotations

import json

import pytest

from engine.cli import cli
from engine.events import LoadRequest, event_from_json
from engine.generate.session import Session
from tests.engine.helpers import PROMPT, WorkerProcess, greedy_request, hf_greedy, token_ids
from tests.fixtures.tiny import ARCHITECTURES

N_NEW = 64


@pytest.fixture(scope="module")
def references(tiny_models):
    return {arch: hf_greedy(path, PROMPT, N_NEW) for arch, path in tiny_models.items()}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_python_api(arch, tiny_models, references):
    session = Session.load(LoadRequest(str(tiny_models[arch]), device="cpu"))
    assert session.lm.compute_dtype.is_floating_point and str(session.lm.compute_dtype) == (
        "torch.float32")  # --quant auto on CPU keeps the checkpoint's float32
    events = list(session.generate(greedy_request(n=N_NEW)))
    assert len(references[arch]) >= 16
    assert token_ids(events) == references[arch]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_cli_run_json(arch, tiny_models, references, capsys):
    rc = cli.main(["run", "--model", str(tiny_models[arch]), "--prompt", PROMPT, "--raw",
                   "--temperature", "0", "--max-new-tokens", str(N_NEW), "--device", "cpu",
                   "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    events = [event_from_json(line) for line in out.splitlines()]
    assert all(json.loads(line)["event"] for line in out.splitlines())
    assert token_ids(events) == references[arch]
    assert events[-1].name == "finished"


def test_worker(tiny_models, references):
    worker = WorkerProcess()
    try:
        for arch in ARCHITECTURES:
            worker.send(command="load", model=str(tiny_models[arch]), device="cpu")
            loaded = worker.stream()
            assert loaded[-1].name == "loaded", loaded[-1]
            worker.send(command="generate", prompt=PROMPT, raw=True, max_new_tokens=N_NEW,
                        sampling={"temperature": 0})
            events = worker.stream()
            assert events[-1].name == "finished"
            assert token_ids(events) == references[arch], arch
    finally:
        assert worker.close() == 0
