"""The bench scripts' shared start (prefill_host.py, int4_profile.py, batch_step_profile.py,
budget_sweep.py): a model with random weights loaded as `hearth bench` loads it, and an Engine
running a session on a thread of its own."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from types import SimpleNamespace

from engine.service.engine import Engine
from engine.tools.bench.concurrent import _load


def load_random(model: str, quant: str, prompt_len: int, new_tokens: int, rows: int = 1):
    """The Session `hearth bench --random-weights --concurrency rows` measures."""
    return _load(SimpleNamespace(model=model, quant=quant, kv_dtype="auto", device="auto",
                                 prompt_len=prompt_len, new_tokens=new_tokens, concurrency=[rows],
                                 memory_limit=None, eager=False, compile=False, lm_head="16bit",
                                 random_weights=True))


@contextmanager
def running(session, max_waiting: int = 4):
    """An Engine over `session`, its loop on a thread, stopped on the way out."""
    engine = Engine(max_waiting=max_waiting)
    engine.session = session
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    try:
        yield engine
    finally:
        engine.stop()
        thread.join(30)
