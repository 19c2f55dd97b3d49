"""The server's load on a GPU: the Qwen2.5-7B shape with random weights in
bf16, talking through the demo model's tokenizer and chat template, in the reproducible mode.
200 requests, 32 at a time, half streamed, some cancelled mid-stream: nothing lost, no malformed
stream, every finished greedy answer the one its question gets alone from the same session."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from engine.events import LoadRequest
from tests.engine.server.test_load import CONCURRENCY, answers_alone, check_load

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU")
REPO = Path(__file__).resolve().parents[3]
SHAPE_7B = REPO / "bench" / "qwen2.5-7b"
DEMO = REPO / "hearth_resources" / "demo_model"


@pytest.fixture(scope="module")
def gpu_server():
    from engine.generate.session import Session
    from engine.service.engine import Engine
    from engine.tools.bench.random_chat_model import random_chat_model
    from tests.engine.server.conftest import start_server

    req = LoadRequest(model=str(SHAPE_7B), device="cuda", quant="bf16", context=1024)
    session = Session(random_chat_model(SHAPE_7B, DEMO, req), reproducible=True,
                      kv_tokens=CONCURRENCY * 1024)
    assert session.config.reproducible and session.decoder.mode == "graph"
    references = answers_alone(session)
    engine = Engine(max_seqs=CONCURRENCY)
    engine.session = session
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    server = start_server(engine)
    yield server, server.app.state.model.id, references
    server.stop()
    engine.stop()
    thread.join(30)


def test_200_requests_32_at_a_time_on_the_gpu_match_each_alone(gpu_server):
    server, model, references = gpu_server
    assert len(set(references.values())) > 1  # random weights still answer each differently
    check_load(server.url, references, model)
