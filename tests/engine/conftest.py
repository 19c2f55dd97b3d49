"""Fixtures shared by the engine tests."""

from __future__ import annotations

import pytest
import torch


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
    try:
        return tiny_awq.build_all(tmp_path_factory.mktemp("awq"), tokenizer_dir)
    finally:
        torch.set_num_threads(threads)
