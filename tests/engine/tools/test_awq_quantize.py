"""`hearth quantize --method awq`: the searches do better than plain rounding where activations
are uneven, the command writes what AutoAWQ writes, and bad input is one sentence (exit 2)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from engine.cli import cli
from engine.quant import awq_format
from engine.tools import awq_search
from engine.tools.calibration import token_blocks


def test_scale_search_protects_the_channels_that_see_large_activations():
    g = torch.Generator().manual_seed(0)
    K, N = 256, 64
    x = torch.randn(2048, K, generator=g)
    x[:, :8] *= 30  # a few salient input channels, as LLM activations have
    w = torch.randn(N, K, generator=g) * 0.02
    err = lambda wq: ((x @ wq.t() - x @ w.t()).pow(2).mean()).item()
    rtn = err(awq_format.fake_quantize(w, 128))
    s, ratio = awq_search.search_scale(x.abs().mean(0), x, [w], 128)
    awq = err(awq_format.fake_quantize(w * s, 128) / s)
    assert ratio > 0 and awq < 0.5 * rtn


def test_scale_search_never_does_worse_than_rounding():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(512, 128, generator=g), torch.randn(32, 128, generator=g)
    s, ratio = awq_search.search_scale(x.abs().mean(0), x, [w], 128)
    err = lambda wq: ((x @ wq.t() - x @ w.t()).pow(2).mean()).item()
    assert err(awq_format.fake_quantize(w * s, 128) / s) <= err(awq_format.fake_quantize(w, 128))


def test_clip_search_lowers_the_output_error():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(512, 256, generator=g)
    w = torch.randn(32, 256, generator=g)
    w[:, 7] *= 12  # one outlier per row stretches every group's range
    err = lambda wq: ((x @ wq.t() - x @ w.t()).pow(2).mean()).item()
    clip = awq_search.search_clip(x, w, 128)
    assert clip.shape == (32, 2)
    assert err(awq_format.fake_quantize(w, 128, clip)) < err(awq_format.fake_quantize(w, 128))


def test_written_checkpoint_is_autoawqs_gemm_format(tiny_awq):
    folder = tiny_awq["llama"]["awq"]
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["quantization_config"] == awq_format.quantization_config(128)
    assert cfg["dtype"] == "float16"
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        q = f.get_tensor("model.layers.0.mlp.down_proj.qweight")
        assert q.dtype == torch.int32 and tuple(q.shape) == (256, 128 // 8)  # [in, out / 8]
        assert f.get_tensor("model.layers.0.mlp.down_proj.scales").dtype == torch.float16
        assert f.get_tensor("model.norm.weight").dtype == torch.float16
    assert not any(n.endswith("proj.weight") for n in names)
    assert "lm_head.weight" in names  # untied llama: its lm_head stays 16-bit, as AutoAWQ's
    for name in ("tokenizer.json", "generation_config.json"):
        assert (folder / name).is_file()


def test_calibration_blocks_are_spread_over_the_text(tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    blocks = token_blocks(tok, ["alpha beta gamma " * 200, "delta epsilon " * 200], 4, 64)
    assert len(blocks) == 4 and all(len(b) == 64 for b in blocks)
    assert blocks[0] != blocks[-1]


@pytest.mark.parametrize("args, words", [
    (["--method", "gptq"], "--method"),
    (["--calibration", "/nonexistent.txt"], "does not exist"),
    (["--num-samples", "0"], "--num-samples"),
])
def test_bad_arguments(args, words, tiny_awq, tmp_path, capsys):
    src = tiny_awq["qwen2"]["source"]
    argv = ["quantize", "--model", str(src), "--out", str(tmp_path / "o"), "--method", "awq"]
    assert cli.main(argv + args) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_bad_models(tiny_awq, tiny_models, tmp_path, capsys):
    cases = [
        (tiny_models["phi3"], "covers Llama, Mistral, Qwen2 and Qwen3"),
        (tiny_awq["qwen2"]["awq"], "already quantized"),
    ]
    for model, words in cases:
        assert cli.main(["quantize", "--model", str(model), "--method", "awq",
                         "--out", str(tmp_path / "o")]) == 2
        assert words in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert cli.main(["quantize", "--model", str(tiny_awq["qwen2"]["source"]), "--method", "awq",
                     "--out", str(tmp_path / "full")]) == 2
    assert "not an empty folder" in capsys.readouterr().err


def test_quantize_then_run_through_the_cli(tiny_awq, tmp_path, capsys):
    """The default calibration text, progress on stderr, and the copy runs with `hearth run`."""
    out = tmp_path / "awq"
    assert cli.main(["quantize", "--model", str(tiny_awq["qwen2"]["source"]), "--method", "awq",
                     "--out", str(out), "--device", "cpu", "--num-samples", "4",
                     "--seq-len", "64"]) == 0
    err = capsys.readouterr().err
    assert "layer 2/2" in err and "calibration: 4 blocks of 64 tokens" in err
    assert cli.main(["run", "--model", str(out), "--prompt", "hi", "--max-new-tokens", "4",
                     "--temperature", "0", "--raw", "--device", "cpu"]) == 0
    assert "as awq on cpu" in capsys.readouterr().err  # on a GPU machine too


def test_rtn_is_the_same_format_without_the_search(tiny_awq, tmp_path, capsys):
    out = tmp_path / "rtn"
    assert cli.main(["quantize", "--model", str(tiny_awq["llama"]["source"]), "--method", "rtn",
                     "--out", str(out), "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "rounded" in err and "calibration" not in err
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "awq"
    with safe_open(str(out / "model.safetensors"), "pt") as f, \
            safe_open(str(tiny_awq["llama"]["source"] / "model.safetensors"), "pt") as src:
        # no scales folded: the norms are the source's, rounded to fp16
        a = f.get_tensor("model.layers.0.input_layernorm.weight")
        assert torch.equal(a, src.get_tensor("model.layers.0.input_layernorm.weight").half())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_quantize_on_the_gpu(tiny_awq, tmp_path, capsys):
    """One layer at a time on the card, searched in bf16: the copy is as close to the 16-bit
    model as the CPU-made one (teacher-forced logits, everything loaded on the GPU)."""
    out = tmp_path / "gpu"
    src = tiny_awq["qwen2"]["source"]
    assert cli.main(["quantize", "--model", str(src), "--method", "awq", "--out", str(out),
                     "--device", "cuda", "--num-samples", "16", "--seq-len", "128"]) == 0
    assert "searching on cuda" in capsys.readouterr().err
    from engine.events import LoadRequest
    from engine.generate.session import Session

    ids = torch.randint(3, 2000, (64,), generator=torch.Generator().manual_seed(3)).cuda()
    logits = {p: Session.load(LoadRequest(str(p), device="cuda")).decoder.forward(ids, 0).float()
              for p in (src, out, tiny_awq["qwen2"]["awq"])}
    err = {p: ((logits[p] - logits[src]).norm() / logits[src].norm()).item() for p in logits}
    assert err[out] < 2 * err[tiny_awq["qwen2"]["awq"]] + 0.02, err
