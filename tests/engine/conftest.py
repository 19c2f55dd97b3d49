"""Fixtures shared by the engine tests."""

from __future__ import annotations

import pytest
import torch

from tests.fixtures.once import once_per_session


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: a second thread only adds synchronization, which a busy CPU makes slow."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_awq(tmp_path_factory, tokenizer_dir):
    """{"qwen2" | "llama": {"source": 16-bit folder, "awq": its `hearth quantize` AWQ copy}}:
    AWQ-sized tiny models (hidden 128), quantized on the CPU once per session (seconds)."""
    from tests.fixtures import tiny_awq

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    def build(folder):
        tiny_awq.build_all(folder, tokenizer_dir)
        return folder

    try:  # once for the session's workers
        return tiny_awq.folders(once_per_session(tmp_path_factory, "tiny-awq", build))
    finally:
        torch.set_num_threads(threads)
