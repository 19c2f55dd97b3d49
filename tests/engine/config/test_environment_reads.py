"""Every knob is resolved at load into the configuration (engine/config/): no module below it
reads the environment, except the process plumbing and storage places listed here with why."""

from __future__ import annotations

import ast
from pathlib import Path

import engine

ROOT = Path(engine.__file__).parent
# modules that read os.environ themselves, and why that is no engine knob
ENVIRONMENT = {
    "platform/child_env.py": "the environment of the processes the engine starts",
    "platform/allocator.py": "torch's CUDA allocator variables, set before CUDA starts",
    "platform/cpu_threads.py": "OMP_NUM_THREADS, OpenMP's own: a user's choice is left alone",
    "platform/display.py": "the desktop session's display, for the window",
    "parallel/leader.py": "NCCL's own variables, in rank 0's environment",
    "parallel/request.py": "CUDA_VISIBLE_DEVICES: which GPUs this process sees",
    "kernels/attention_backend.py": "CC: the host compiler Triton builds its launcher with",
    "kernels/int4_gemm_kernel.py": "TRITON_INTERPRET: Triton's own interpreter mode",
    "kernels/experts/grouped_kernel.py": "TRITON_INTERPRET: Triton's own interpreter mode",
    "tools/doctor.py": "CC, reported by the diagnostics",
    "files/model_home.py": "where models are stored (HEARTH_MODELS_DIR, XDG, the HF cache)",
    "files/gguf_import.py": "HEARTH_STARTER_WHEEL: an installation's starter model",
    "files/hub_listing.py": "HF_ENDPOINT: where the hub is",
    "tools/desktop_entry.py": "XDG_DATA_HOME: where the desktop entry goes",
    "server/command.py": "HEARTH_SERVER_API_KEY: a secret kept out of argv",
    "remote/run_command.py": "an endpoint's API key, kept out of argv",
}
# modules that ask config/overrides.py to read the developer overrides: once per load, at the
# load's entry, or for what is no engine setting (tracebacks, the tests' fault injection)
OVERRIDES = {
    "generate/session_load.py": "a load's entry: resolves the configuration once",
    "parallel/session.py": "a tensor-parallel load's entry; followers take rank 0's",
    "tools/bench/decode.py": "the benchmark's own load",
    "tools/bench/speculative.py": "the benchmark's draft load",
    "tools/bench/random_chat_model.py": "the benchmark's random model",
    "tools/bench/concurrent.py": "the benchmark's random-weights session",
    "platform/library_noise.py": "HEARTH_DEBUG: third-party notes",
    "files/gguf_import.py": "HEARTH_DEBUG: third-party notes",
    "cli/cli.py": "HEARTH_DEBUG: a failed command's traceback",
    "parallel/follower.py": "the tests' fault injection hook",
}


def reads(tree: ast.AST) -> tuple[bool, bool]:
    """(reads os.environ or getenv, calls one of overrides' readers)."""
    environment = overrides = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "os" and node.attr in ("environ", "getenv", "environb"):
                environment = True
        if isinstance(node, ast.ImportFrom) and node.module == "os" and any(
                a.name in ("environ", "getenv") for a in node.names):
            environment = True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "overrides":
            overrides = True
    return environment, overrides


def test_nothing_below_config_reads_the_environment():
    environment, overrides = set(), set()
    for path in ROOT.rglob("*.py"):
        name = path.relative_to(ROOT).as_posix()
        if name.startswith("config/"):
            continue
        env, ov = reads(ast.parse(path.read_text()))
        if env:
            environment.add(name)
        if ov:
            overrides.add(name)
    assert environment <= set(ENVIRONMENT), sorted(environment - set(ENVIRONMENT))
    assert overrides <= set(OVERRIDES), sorted(overrides - set(OVERRIDES))
    # the lists name no module that stopped reading (a stale entry hides a new reader)
    assert set(ENVIRONMENT) <= environment, sorted(set(ENVIRONMENT) - environment)
    assert set(OVERRIDES) <= overrides, sorted(set(OVERRIDES) - overrides)


def test_the_scan_sees_each_way_of_reading():
    assert reads(ast.parse("import os\nos.environ.get('X')")) == (True, False)
    assert reads(ast.parse("from os import getenv")) == (True, False)
    assert reads(ast.parse("from engine.config import overrides\noverrides.backends()")) == (
        False, True)
    assert reads(ast.parse("x = overrides.PDL")) == (False, False)  # a name is no read
