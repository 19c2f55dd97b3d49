"""`--tensor-parallel N` end to end on CPU (gloo: rank 0 in this process or in the worker, rank 1
a child process): TPSession against Session, `hearth run` and `hearth bench`, the worker's load
and its failures (one Failed, every follower gone), and the checks that run before torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.cli import cli
from engine.events import BadRequest, Failed, LoadRequest, request_from_json
from engine.generate.session import Session
from engine.parallel import request as tp_request
from engine.platform.child_env import NO_MULTICAST
from tests.engine.helpers import PROMPT, REPO, WorkerProcess, finished, greedy_request, token_ids
from tests.engine.parallel.faults import FAIL_AT_LOAD, FAIL_AT_STEP, inject

CPU_TP = ["--tensor-parallel", "2", "--device", "cpu"]
pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(),
                                reason="follower processes are found through /proc (Linux)")


def children(pid: int) -> set[int]:
    """The live (not zombie) child processes of `pid`."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, IndexError):  # ended while we looked
            continue
        if int(ppid) == pid and state != "Z":
            found.add(int(stat.parent.name))
    return found


def gone_within(pids, seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while any(Path(f"/proc/{p}").exists() and _state(p) != "Z" for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


# ---------------------------------------------------------------- the session

def test_tp_session_equals_session_and_ends_its_follower(tiny_model, one_thread, monkeypatch):
    from engine.parallel.session import TPSession

    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")  # a parent's setting never reaches a rank
    req = LoadRequest(str(tiny_model), device="cpu", context=256)
    one = Session.load(req)
    two = TPSession.load(LoadRequest(str(tiny_model), device="cpu", context=256,
                                     tensor_parallel=2))
    try:
        [pid] = two.leader.follower_pids.values()
        assert pid in children(os.getpid())
        env = environ(pid)
        assert {k: env.get(k) for k in NO_MULTICAST} == NO_MULTICAST
        loaded = two.loaded_event()
        assert "tensor parallel over 2 CPU processes (gloo)" in loaded.notes
        assert loaded.weights_bytes == one.loaded_event().weights_bytes
        assert two.cache.num_bytes * 2 == one.cache.num_bytes  # one KV head of two per rank
        plain = finished(list(one.generate(greedy_request(n=24))))
        events = list(two.generate(greedy_request(n=24)))
        assert token_ids(events) == token_ids(list(one.generate(greedy_request(n=24))))
        assert finished(events).stats.new_tokens == plain.stats.new_tokens == 24
        # a second turn reuses the cached prefix (a batch of one each time, over rank 0's blocks)
        again = list(two.generate(greedy_request(n=24)))
        assert token_ids(again) == token_ids(events)
        # prompt lookup's verify rows run on every rank; greedy, they change no token
        copy = "copy: a b c d e a b c d e a b"
        looked = list(two.generate(greedy_request(copy, n=24, prompt_lookup=True)))
        ref = list(one.generate(greedy_request(copy, n=24)))
        assert token_ids(looked) == token_ids(ref)
        assert finished(looked).stats.proposed_draft_tokens > 0
    finally:
        two.close()
    assert gone_within([pid])
    two.close()  # twice is harmless


# ---------------------------------------------------------------- hearth run and bench

def _run_json(capsys, model, *flags) -> list[dict]:
    rc = cli.main(["run", "--model", str(model), "--prompt", PROMPT, "--raw", "--json",
                   "--max-new-tokens", "16", "--context", "256", *flags])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return [json.loads(line) for line in out.splitlines()]


def _ids(events: list[dict]) -> list[int]:
    return [i for e in events if e["event"] == "token" for i in e["token_ids"]]


def test_rank_0_reports_what_the_fused_pieces_did(tiny_model, one_thread, monkeypatch):
    """The load event says whether the fused step pieces run, as on one GPU (rank 0's verdict;
    here its check is made to fail, so the step keeps PyTorch's pieces and says so)."""
    from engine.parallel import follower as tp_worker
    from engine.parallel.session import TPSession

    verdict = "the fused decode-step kernels failed here (a test); the step keeps PyTorch's pieces"
    monkeypatch.setattr(tp_worker.fused_ops, "wanted", lambda device, setting=None: True)
    monkeypatch.setattr(tp_worker.fused_ops, "enable", lambda step: verdict)
    two = TPSession.load(LoadRequest(str(tiny_model), device="cpu", context=256,
                                     tensor_parallel=2))
    try:
        assert verdict in two.loaded_event().notes
    finally:
        two.close()


@pytest.mark.parametrize("sampling", [["--temperature", "0"],
                                      ["--temperature", "0.9", "--top-k", "50", "--seed", "5"]])
def test_run_prints_what_one_device_prints(sampling, tiny_model, capsys, one_thread):
    before = children(os.getpid())
    one = _run_json(capsys, tiny_model, "--device", "cpu", *sampling)
    two = _run_json(capsys, tiny_model, *CPU_TP, *sampling)
    assert len(_ids(one)) == 16 and _ids(two) == _ids(one)
    kinds = lambda events: [e["event"] for e in events if e["event"] in ("loaded", "finished")]
    assert kinds(two) == kinds(one) == ["loaded", "finished"]
    assert two[-1]["reason"] == "max_tokens" and two[-1]["stats"]["new_tokens"] == 16
    assert any("tensor parallel over 2" in n for n in two[[e["event"] for e in two].index(
        "loaded")]["notes"])
    assert gone_within(children(os.getpid()) - before)  # the command ends its follower


def test_run_text_output_has_the_same_shape(tiny_model, capsys, one_thread):
    args = ["run", "--model", str(tiny_model), "--prompt", PROMPT, "--raw", "--temperature", "0",
            "--max-new-tokens", "8", "--context", "256"]
    assert cli.main([*args, "--device", "cpu"]) == 0
    one = capsys.readouterr()
    assert cli.main([*args, *CPU_TP]) == 0
    two = capsys.readouterr()
    assert two.out == one.out  # the generated text, and nothing else, on stdout
    last = lambda err: err.strip().splitlines()[-1]
    assert last(two.err).startswith("[max_tokens] 8 tokens, ttft ")
    assert last(one.err).startswith("[max_tokens] 8 tokens, ttft ")
    assert any(line.startswith("loaded Qwen2ForCausalLM as fp32 on cpu")
               for line in two.err.splitlines())


def test_bench_reports_decode_speed(tiny_model, capsys, one_thread):
    rc = cli.main(["bench", "--model", str(tiny_model), "--random-weights", *CPU_TP,
                   "--prompt-len", "16", "--new-tokens", "8", "--num-prompts", "1", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    r = json.loads(out)
    assert r["tensor_parallel"] == 2 and r["decode_tokens_per_s"] > 0
    assert len(r["decode_runs_tokens_per_s"]) == 3 and r["decode_path"] == "static"
    assert r["peak_vram_bytes_per_gpu"] is None  # no GPU: nothing for NVML to read


# ---------------------------------------------------------------- bad input, before torch

def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("flags, words", [
    (["--tensor-parallel", "0"], "--tensor-parallel takes a whole number of GPUs, 1 or more"),
    (["--tensor-parallel", "-2"], "got -2"),
    (["--tensor-parallel", "two"], "invalid int value: 'two'"),
    (["--tensor-parallel", "3", "--device", "cpu"], "3 cards do not split this model evenly: "
                                                    "each must hold whole KV heads (2) and equal "
                                                    "MLP slices (128); --tensor-parallel takes 2"),
    (["--tensor-parallel", "2", "--quant", "nf4"], "16-bit weights only"),
    (["--tensor-parallel", "2", "--kv-dtype", "fp8"], "16-bit KV cache"),
])
def test_bad_tensor_parallel_settings(flags, words, tiny_model, capsys):
    rc = cli.main(["run", "--model", str(tiny_model), "--prompt", "hi", *flags])
    assert rc == 2
    assert words in one_error_line(capsys)


@pytest.mark.parametrize("command", ["run", "bench"])
def test_too_few_gpus(command, tiny_model, capsys, monkeypatch):
    monkeypatch.setattr(tp_request, "detect_gpus", lambda: _report(1))
    extra = ["--prompt", "hi"] if command == "run" else ["--random-weights"]
    rc = cli.main([command, "--model", str(tiny_model), "--tensor-parallel", "2", *extra])
    assert rc == 2
    line = one_error_line(capsys)
    assert "--tensor-parallel 2 needs 2 NVIDIA GPUs and this machine has 1" in line
    assert "--device cpu" in line


def _report(n: int):
    from engine.platform.gpu import GpuInfo, GpuReport

    return GpuReport(tuple(GpuInfo(i, "Fake", f"GPU-{i}", 24 << 30, 24 << 30, 0, (9, 0), "1", True,
                                   True) for i in range(n)))


def test_cuda_visible_devices_narrows_the_count(monkeypatch):
    monkeypatch.setattr(tp_request, "detect_gpus", lambda: _report(4))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert tp_request.visible_gpus()[0] == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert tp_request.visible_gpus()[0] == 0
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert tp_request.visible_gpus() == (4, "")


@pytest.mark.parametrize("flags", [["--tensor-parallel", "2"],
                                   ["--tensor-parallel", "3", "--device", "cpu"]])
def test_fails_without_importing_torch(flags, tiny_model):
    code = ("import sys; from engine.cli import cli; rc = cli.main(sys.argv[1:]); "
            "assert 'torch' not in sys.modules, 'torch was imported'; sys.exit(rc)")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU for CUDA, whatever NVML sees
    proc = subprocess.run([sys.executable, "-c", code, "run", "--model", str(tiny_model),
                           "--prompt", "hi", *flags], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "--tensor-parallel" in proc.stderr


def test_torch_must_see_the_gpus_too(monkeypatch):
    """NVML may count cards that this torch cannot use (a CPU build): refused before loading."""
    import torch

    from engine.parallel.session import device_for, host_request

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(BadRequest, match="needs 2 CUDA GPUs and torch sees 1"):
        device_for(LoadRequest(tensor_parallel=2))
    cpu = LoadRequest(tensor_parallel=2, device="cpu", memory_limit_gib=24)
    assert device_for(cpu).type == "cpu"
    host = host_request(cpu, device_for(cpu))  # the whole model, in host memory, one device
    assert (host.device, host.quant, host.memory_limit_gib, host.tensor_parallel) == (
        "cpu", "auto", None, 1)


@pytest.mark.parametrize("n", [0, -1, True, 2.0, "2", None])
def test_load_request_takes_a_whole_number(n):
    with pytest.raises(BadRequest, match="--tensor-parallel takes a whole number"):
        LoadRequest(tensor_parallel=n).validate()


def test_load_request_refuses_what_the_cut_cannot_hold():
    for kw, words in (({"quant": "int8"}, "16-bit weights"), ({"kv_dtype": "int8"}, "KV cache"),
                      ({"draft": "d"}, "draft model"), ({"eager": True}, "--eager")):
        with pytest.raises(BadRequest, match=words):
            LoadRequest(tensor_parallel=2, **kw).validate()
        LoadRequest(tensor_parallel=1, **kw).validate()  # one device takes them
    req = request_from_json('{"command": "load", "tensor_parallel": 4, "device": "cpu"}')
    assert req.tensor_parallel == 4
    req.validate()


# ---------------------------------------------------------------- the worker

@pytest.fixture
def start_worker():
    """start_worker() -> a real `hearth worker` with this test's environment; each is killed
    after 120 s, so that a hang fails the test rather than the run."""
    started = []

    def start() -> WorkerProcess:
        w = WorkerProcess()
        guard = threading.Timer(120, w.proc.kill)
        guard.start()
        started.append((w, guard))
        return w

    yield start
    for w, guard in started:
        guard.cancel()
        if w.proc.poll() is None:
            w.proc.kill()
            w.proc.wait()


def _load(w: WorkerProcess, model) -> list:
    w.send(command="load", model=str(model), device="cpu", context=256, tensor_parallel=2)
    return w.stream()


def _generate(w: WorkerProcess, n: int = 12) -> list:
    w.send(command="generate", prompt=PROMPT, raw=True, max_new_tokens=n,
           sampling={"temperature": 0})
    return w.stream()


def _ends(events) -> list[str]:
    return [e.name for e in events if e.name in ("loaded", "finished", "failed")]


def test_worker_loads_generates_and_unloads_two_ranks(start_worker, tiny_model):
    worker = start_worker()
    assert _ends(_load(worker, tiny_model)) == ["loaded"]
    followers = children(worker.proc.pid)
    assert len(followers) == 1
    events = _generate(worker)
    assert _ends(events) == ["finished"] and len(token_ids(events)) == 12
    worker.send(command="unload")
    assert _ends(worker.stream()) == ["finished"]
    assert gone_within(followers)
    # a new process group in the same process: the same tokens again
    assert _ends(_load(worker, tiny_model)) == ["loaded"]
    second = children(worker.proc.pid)
    assert len(second) == 1 and not second & followers
    assert token_ids(_generate(worker)) == token_ids(events)
    assert worker.close() == 0
    assert gone_within(second)  # shutdown ends the followers too


def test_worker_a_rank_failing_at_load_is_one_failed(start_worker, tiny_model, monkeypatch):
    inject(monkeypatch, FAIL_AT_LOAD, "1")  # the worker's follower inherits it
    w = start_worker()
    events = _load(w, tiny_model)
    assert _ends(events) == ["failed"]
    err = events[-1].error
    assert "rank 1 of 2 failed: RuntimeError: injected failure at load" in err, err
    assert "every rank was stopped" in err
    assert gone_within(children(w.proc.pid), 5)
    # the worker lives on, and the next answer is to the next command: no second Failed
    events = _generate(w)
    assert len(events) == 1 and events[0].error == "no model is loaded"
    assert w.close() == 0


def test_worker_a_rank_failing_at_a_step_is_one_failed(start_worker, tiny_model, monkeypatch):
    inject(monkeypatch, FAIL_AT_STEP, "1:4")  # rank 1 raises at its fourth decode step
    w = start_worker()
    assert _ends(_load(w, tiny_model)) == ["loaded"]
    followers = children(w.proc.pid)
    assert len(followers) == 1
    events = _generate(w)
    assert _ends(events) == ["failed"]
    assert len(token_ids(events)) == 4  # the prefill's token and three steps'
    err = events[-1].error
    assert "rank 1 of 2 failed: RuntimeError: injected failure at decode step 4" in err, err
    assert gone_within(followers, 5)
    again = _generate(w)  # the broken group answers at once, with the same error
    assert _ends(again) == ["failed"] and "rank 1 of 2 failed" in again[-1].error
    assert isinstance(again[-1], Failed)
    assert w.close() == 0
