"""`hearth bench` and `hearth eval` through cli.main on CPU, so CI exercises them."""

from __future__ import annotations

import json

from engine.cli import cli


def test_bench_json_reports_speed_and_references(tiny_model, capsys):
    rc = cli.main(["bench", "--model", str(tiny_model), "--prompt-len", "32", "--new-tokens", "8",
                   "--num-prompts", "2", "--device", "cpu", "--baseline-hf", "--json"])
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    assert r["decode_path"] == "static" and r["prompt_len"] == 32 and r["new_tokens"] == 8
    assert len(r["decode_runs_tokens_per_s"]) == 3
    assert r["decode_tokens_per_s"] > 0 and r["ttft_ms"] > 0 and r["roofline_tokens_per_s"] > 0
    assert r["hf_generate_decode_tokens_per_s"] > 0 and r["speedup_vs_hf"] > 0
    assert r["throughput_tokens_per_s"] > 0 and r["num_prompts"] == 2
    assert "batch 1" in r["batching"]
    # the bytes a decode step reads at the measured rate
    assert r["effective_bandwidth_bytes_per_s"] == round(r["decode_tokens_per_s"]
                                                         * r["bytes_per_decode_step"])


def test_bench_random_weights_from_config_alone(tiny_model, tmp_path, capsys):
    (tmp_path / "config.json").write_text((tiny_model / "config.json").read_text())
    rc = cli.main(["bench", "--model", str(tmp_path), "--random-weights", "--prompt-len", "16",
                   "--new-tokens", "4", "--num-prompts", "1", "--device", "cpu"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "| decode (median of 3) |" in out and "roofline" in out
    assert "| effective bandwidth |" in out


def test_bench_refuses_what_it_cannot_do_yet(tiny_model, capsys):
    assert cli.main(["bench", "--model", str(tiny_model), "--turns", "3"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_eval_defaults_to_the_demo_model(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("Return the locale settings for the given locale category. " * 20)
    assert cli.main(["eval", "--text", str(text), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["tokens"] > 100 and 1 < r["perplexity"] < 1000
    assert r["model"].endswith("demo_model")
