"""The CPU thread policy (child_env.thread_policy) reaches torch in the worker and in `hearth run`:
one OpenMP thread per physical core and OpenMP's own wait policy, read back from the processes
themselves (libgomp's report of its settings, torch.get_num_threads()); what the
user set is kept. The thread governor (fewer threads while the CPU is busy elsewhere):
test_cpu_threads.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from engine.events import LoadRequest, ShutdownRequest, request_to_json
from engine.platform.child_env import child_env, physical_cores, thread_policy
from tests.engine.helpers import REPO

# prints torch's thread count when the process ends (the worker's or the CLI's own main ran),
# whether it returns or leaves through os._exit (the worker skips the interpreter's teardown)
AT_EXIT = ("import atexit, os, runpy, sys\n"
           "def report():\n"
           "    print('torch threads', sys.modules['torch'].get_num_threads(), 'torchao imported',"
           " 'torchao' in sys.modules, file=sys.stderr, flush=True)\n"
           "atexit.register(report)\n"
           "_exit = os._exit\n"
           "os._exit = lambda code: (atexit.unregister(report), report(), _exit(code))\n"
           "sys.argv[1:] = {argv!r}\n"
           "runpy.run_module({module!r}, run_name='__main__')\n")


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without the OpenMP settings (importing engine here put them in), and
    with libgomp asked to print the settings it started with (OMP_DISPLAY_ENV)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    # the repository first, then whatever path this process was given (a GPU machine's
    # carried wheels live on PYTHONPATH)
    path = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    return {**env, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "OMP_DISPLAY_ENV": "VERBOSE",
            **extra}


def openmp_settings(stderr: str) -> dict[str, str]:
    return dict(re.findall(r"^\s+((?:OMP|GOMP)_\w+) = '([^']*)'", stderr, re.M))


def assert_policy_reached_torch(stderr: str) -> None:
    omp = openmp_settings(stderr)
    assert omp, stderr[-2000:]
    cores = physical_cores()
    assert omp["GOMP_SPINCOUNT"] == "300000", omp  # libgomp's own default, left alone
    assert omp["OMP_NUM_THREADS"] == str(cores), omp
    # at the end: the governor may have lowered the generating thread's count, never raised it
    threads = int(re.search(r"torch threads (\d+) ", stderr).group(1))
    assert 1 <= threads <= cores, stderr[-2000:]


def test_the_worker_runs_torch_with_the_policy(tiny_models):
    code = AT_EXIT.format(argv=[], module="engine.cli.worker")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=clean_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        proc.stdin.write(request_to_json(LoadRequest(model=str(tiny_models["qwen2"]),
                                                     device="cpu")) + "\n")
        proc.stdin.flush()
        events = _until_loaded(proc.stdout)
        assert events[-1] == "loaded", events
        proc.stdin.write(request_to_json(ShutdownRequest()) + "\n")
        proc.stdin.close()
        stderr = proc.stderr.read()
        assert proc.wait(timeout=60) == 0, stderr[-2000:]
    finally:
        proc.kill()
    assert_policy_reached_torch(stderr)


def _until_loaded(stdout) -> list[str]:
    """The worker's events up to its Loaded (or the first terminal event)."""
    events = []
    for line in iter(stdout.readline, ""):
        events.append(json.loads(line)["event"])
        if events[-1] in ("loaded", "failed", "finished"):
            break
    return events


def test_hearth_run_runs_torch_with_the_policy_quietly(tiny_models):
    """Also no third-party notes on stderr (torchao's missing _C_mxfp8,
    pytree's Enum notices, bitsandbytes' casting note on this int8 run), and torchao (from the
    awq extra) not imported at all when AWQ is not used."""
    argv = ["run", "--model", str(tiny_models["qwen2"]), "--prompt", "hi", "--quant", "int8",
            "--max-new-tokens", "2", "--temperature", "0", "--device", "cpu"]
    code = AT_EXIT.format(argv=argv, module="engine.cli.cli")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=clean_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert_policy_reached_torch(proc.stderr)
    assert "torchao imported False" in proc.stderr
    ours = [line for line in proc.stderr.splitlines()
            if not re.match(r"\s+\S+ = '|OPENMP DISPLAY|torch threads", line)]
    noise = [line for line in ours if re.search(
        r"Failed to load|_pytree|Enum subclass|MatMul8bitLt|will be cast|bitsandbytes", line)]
    assert not noise, "\n".join(ours)


def test_the_users_settings_are_kept():
    assert thread_policy({"OMP_NUM_THREADS": "3", "OMP_WAIT_POLICY": "ACTIVE"}) == {}
    assert thread_policy({"OMP_NUM_THREADS": "3"}) == {}
    assert thread_policy({}) == {"OMP_NUM_THREADS": str(physical_cores())}


def test_child_env_carries_the_policy(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    env = child_env()
    assert "GOMP_SPINCOUNT" not in env and "OMP_WAIT_POLICY" not in env
    assert env["OMP_NUM_THREADS"] == str(physical_cores())
    assert child_env({"OMP_NUM_THREADS": "1"})["OMP_NUM_THREADS"] == "1"


def _topology(root, cpu: int, package: int, core: int) -> None:
    folder = root / f"cpu{cpu}" / "topology"
    folder.mkdir(parents=True)
    (folder / "physical_package_id").write_text(f"{package}\n")
    (folder / "core_id").write_text(f"{core}\n")


def test_physical_cores_count_hyperthread_twins_once(tmp_path):
    for cpu, (package, core) in enumerate([(0, 0), (0, 1), (0, 0), (0, 1), (1, 0), (1, 0)]):
        _topology(tmp_path, cpu, package, core)
    assert physical_cores({0, 1, 2, 3, 4, 5}, tmp_path) == 3
    assert physical_cores({0, 2}, tmp_path) == 1  # an affinity mask of two twins
    assert physical_cores({0, 9}, tmp_path) == 2  # no topology for cpu9: count the CPUs
