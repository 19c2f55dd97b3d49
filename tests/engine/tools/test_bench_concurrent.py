"""`hearth bench --concurrency`: N prompts at once through one Engine on the bundled demo model
(CPU), the seed's fields checked against the recorded clock readings, and the arithmetic alone
on synthetic timestamps."""

from __future__ import annotations

import argparse
import json
import threading

import pytest

from engine.cli import cli
from engine.events import LoadRequest
from engine.generate.session import Session
from engine.service.engine import Engine
from engine.tools.bench.concurrent import submit_all
from engine.tools.bench.decode import _prompts
from engine.tools.bench.timing import Timing, aggregate_decode, percentile, summarize

NEW_TOKENS = 8


def test_aggregate_decode_counts_tokens_after_each_first_over_first_first_to_last():
    a = [10.0, 10.5, 11.0, 11.5]  # 3 tokens after its first
    b = [10.2, 12.0]  # 1 after its first, and the last token of all
    c = [11.2]  # a single token: nothing decoded
    assert aggregate_decode([a, b, c]) == pytest.approx(4 / (12.0 - 10.0))
    assert aggregate_decode([[1.0], [2.0], []]) is None  # no decode step at all


def test_summarize_on_synthetic_times():
    t0 = 100.0
    timings = [Timing(100.0, [100.4, 100.6, 100.9], 101.0, "max_tokens"),
               Timing(100.1, [101.1, 101.2, 101.6], 102.0, "max_tokens")]
    r = summarize(timings, t0)
    assert r.concurrency == 2 and r.num_finished == 2
    assert r.total_time == pytest.approx(2.0) and r.total_tokens == 6
    assert r.throughput == pytest.approx(3.0) and r.avg_latency == pytest.approx(1.0)
    assert r.aggregate_decode_tokens_per_s == pytest.approx(4 / (101.6 - 100.4))
    assert r.ttft_ms_p50 == pytest.approx(700.0)  # 400 and 1000 ms, halfway
    assert r.ttft_ms_p99 == pytest.approx(400 + 0.99 * 600)
    gaps_ms = sorted([200, 300, 100, 400])
    assert r.itl_ms_p50 == pytest.approx(250.0) and r.itl_ms_p99 == pytest.approx(
        gaps_ms[2] + 0.97 * (gaps_ms[3] - gaps_ms[2]))
    assert percentile(list(range(101)), 99) == 99 and percentile([], 50) is None


@pytest.fixture(scope="module")
def engine():
    eng = Engine()
    eng.session = Session.load(LoadRequest(None, device="cpu"))  # no model: the demo model
    thread = threading.Thread(target=eng.run, daemon=True)
    thread.start()
    yield eng
    eng.stop()
    thread.join()


def test_every_request_finishes_and_the_seed_fields_follow_the_recorded_times(engine):
    vocab = engine.session.lm.model.config.vocab_size
    prompts = _prompts(4, 12, vocab, seed=7)
    timings, t_start = submit_all(engine, prompts, NEW_TOKENS)
    assert [t.reason for t in timings] == ["max_tokens"] * 4  # every stream ended, none failed
    assert all(len(t.token_s) == NEW_TOKENS for t in timings)
    for t in timings:
        assert t_start <= t.submit_s < t.token_s[0]
        assert t.token_s == sorted(t.token_s) and t.token_s[-1] <= t.end_s
    r = summarize(timings, t_start)
    total_time = max(t.end_s for t in timings) - t_start
    assert r.total_time == total_time and r.total_tokens == 4 * NEW_TOKENS
    assert r.throughput == r.total_tokens / total_time
    assert r.avg_latency == total_time / len(prompts)  # the seed's definition
    first = min(t.token_s[0] for t in timings)
    last = max(t.token_s[-1] for t in timings)
    assert r.aggregate_decode_tokens_per_s == pytest.approx(4 * (NEW_TOKENS - 1) / (last - first))
    assert 0 < r.ttft_ms_p50 <= r.ttft_ms_p99 <= total_time * 1000
    assert 0 <= r.itl_ms_p50 <= r.itl_ms_p99


def _check_row(row: dict, n: int) -> None:
    assert row["concurrency"] == n and row["num_finished"] == n
    assert row["total_tokens"] == n * NEW_TOKENS
    assert row["throughput"] == pytest.approx(row["total_tokens"] / row["total_time"])
    assert row["avg_latency"] == pytest.approx(row["total_time"] / n)
    assert row["aggregate_decode_tokens_per_s"] > 0
    assert 0 < row["ttft_ms_p50"] <= row["ttft_ms_p99"]
    assert 0 <= row["itl_ms_p50"] <= row["itl_ms_p99"]


def test_the_sweep_prints_json_and_writes_the_same_file(tmp_path, capsys):
    out = tmp_path / "concurrent.json"
    rc = cli.main(["bench", "--concurrency", "1,4", "--prompt-len", "12", "--new-tokens",
                   str(NEW_TOKENS), "--repeats", "1", "--device", "cpu", "--json",
                   "--out", str(out)])
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    assert r == json.loads(out.read_text())
    assert r["model"].endswith("demo_model") and r["prompt_len"] == 12 and r["repeats"] == 1
    assert r["batching"].startswith("continuous batching") and r["preemptions"] == 0
    assert set(r["memory"]) == {"unavailable"} and "CPU" in r["memory"]["unavailable"]
    _check_row(r["batch_1"], 1)
    assert [row["concurrency"] for row in r["rows"]] == [1, 4]
    for row in r["rows"]:
        _check_row(row, row["concurrency"])
    peer = r["peer_transformers_generate_batch"]
    assert peer["transformers"]
    if "unavailable" in peer:  # a reason, never a number it did not measure
        assert peer["unavailable"] and "rows" not in peer
    else:
        assert [row["concurrency"] for row in peer["rows"]] == [1, 4]
        for row in peer["rows"]:
            if "not_run" not in row:
                _check_row(row, row["concurrency"])


def test_the_table_names_the_seed_fields(capsys, monkeypatch):
    """Also: the bench's engine is the server's (service/start.py): the same batch size, and
    the session built on the engine's own thread, where torch keeps the CPU thread count that
    the session's governor starts from."""
    from engine.config.engine_config import MAX_SEQS
    from engine.server import command
    from engine.service import start

    built, engines = [], []
    init = Session.__init__

    def recording_init(self, *args, **kwargs):
        built.append(threading.current_thread().name)
        init(self, *args, **kwargs)

    def recording_start(*args, **kwargs):
        engines.append(start_engine(*args, **kwargs))
        return engines[-1]

    start_engine = start.start
    monkeypatch.setattr(Session, "__init__", recording_init)
    monkeypatch.setattr(start, "start", recording_start)
    assert cli.main(["bench", "--concurrency", "2", "--prompt-len", "8", "--new-tokens", "4",
                     "--repeats", "1", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    for name in ("total_time", "total_tokens", "throughput", "avg_latency", "TTFT p50",
                 "ITL p50", "one request alone", "transformers generate_batch"):
        assert name in out
    ((engine, thread),) = engines
    assert built == [thread.name]  # one session, built on the engine's own thread
    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    assert engine.max_seqs == MAX_SEQS == parser.parse_args(["serve"]).max_seqs


@pytest.mark.parametrize("argv", [
    ["--concurrency", "0"], ["--concurrency", "abc"], ["--concurrency", "4,"],
    ["--concurrency", "1,99999"], ["--repeats", "2"], ["--concurrency", "4", "--repeats", "0"],
    ["--concurrency", "4", "--prompt-lookup"], ["--concurrency", "4", "--new-tokens", "1"],
])
def test_bad_values_exit_2_with_one_line(argv, capsys):
    assert cli.main(["bench", "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("hearth: ")


def test_memory_figures_plan_the_arena_the_engine_sized(monkeypatch):
    """The planner's prediction for the sequences the arena holds whole (here 4 of 6 asked),
    beside the sampled NVML peak: what the GPU run reports, computed from a CPU session."""
    import types

    import torch

    from app.paths import DEMO_MODEL_DIR
    from engine.events import LoadRequest
    from engine.generate.session import Session
    from engine.tools.bench import memory_peak

    session = Session.load(LoadRequest(str(DEMO_MODEL_DIR), device="cpu", context=256,
                                       kv_tokens=4 * 256))
    gpu_lm = types.SimpleNamespace(**{k: getattr(session.lm, k)
                                      for k in ("folder", "quant", "context")},
                                   device=torch.device("cuda"))
    as_gpu = types.SimpleNamespace(lm=gpu_lm, cache=session.cache, config=session.config,
                                   kv_dtype=session.kv_dtype, prefill_chunk=session.prefill_chunk)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 123)
    sampler = memory_peak.PeakSampler(torch.device("cpu"))
    sampler.peak = 10 * 2**20
    m = memory_peak.figures(as_gpu, sampler, concurrency=6)
    assert m["planned_sequences"] == 4 and m["arena_blocks"] == len(session.cache.blocks.blocks)
    assert m["planned_kv_bytes"] > 0 and m["predicted_bytes"] > m["planned_kv_bytes"]
    assert m["predicted_over_nvml_peak"] == round(m["predicted_bytes"] / (10 * 2**20), 4)
    assert m["torch_peak_reserved_bytes"] == 123 and m["nvml_peak_bytes"] == 10 * 2**20
