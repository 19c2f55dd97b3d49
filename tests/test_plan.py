"""The VRAM planner: the seed's arithmetic, real model shapes, the decision tree, `hearth plan`."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.plan.memory import (
    CUDA_CONTEXT_BYTES,
    GiB,
    ModelShape,
    PlanError,
    kv_bytes_per_token,
    margin_bytes,
    plan,
    recommend,
    seed_kv_cache_size,
    weight_bytes,
)
from engine.platform.gpu import GpuInfo, GpuReport
from engine.tools import plan_report

REPO = Path(__file__).resolve().parents[1]
QWEN7B = dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=3584,
              num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
              intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False,
              max_position_embeddings=32768, sliding_window=131072, use_sliding_window=False,
              torch_dtype="bfloat16")
QWEN05B = dict(QWEN7B, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
               num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
               tie_word_embeddings=True)
QWEN72B = dict(QWEN7B, hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
               num_key_value_heads=8, intermediate_size=29568)
# the seed's "7B": 32 layers x 32 heads x 128, multi-head attention (Llama-2-7B's shape)
SEED7B = dict(model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
              intermediate_size=11008, vocab_size=32000, max_position_embeddings=131072,
              torch_dtype="float16")
AWQ = {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128},
       "torch_dtype": "float16"}
A100_80G, RTX4090 = 80 * GiB, 24 * GiB
shape = ModelShape.from_config


# ---------------------------------------------------------------- the seed's arithmetic


def test_seed_kv_cache_example():
    size = seed_kv_cache_size(num_layers=32, num_heads=32, head_dim=128, seq_len=8192,
                              batch_size=1)
    assert f"{size / 1024**3:.2f} GB" == "4.00 GB"


@pytest.mark.parametrize("tokens,gib", [(2048, 1), (8192, 4), (32768, 16), (131072, 64)])
def test_seed_memory_table(tokens, gib):
    s = shape(SEED7B)
    assert seed_kv_cache_size(32, 32, 128, tokens, 1) == gib * GiB
    p = plan(s, "fp16", "fp16", tokens)
    assert p.kv_bytes == gib * GiB  # the planner agrees with the seed for MHA
    gqa = shape(dict(SEED7B, num_key_value_heads=8))  # 8 KV heads of 32: a quarter
    assert plan(gqa, "fp16", "fp16", tokens).kv_bytes == gib * GiB // 4


def test_seed_7b_fp16_weights_about_14_gb():
    w = weight_bytes(shape(SEED7B), "fp16")
    assert abs(w - 14e9) / 14e9 < 0.05  # 6.74 B parameters


# ---------------------------------------------------------------- shapes


def test_qwen25_7b_numbers():
    s = shape(QWEN7B)
    assert s.total_params == 7_615_616_512
    assert abs(weight_bytes(s, "bf16") - 15.23e9) / 15.23e9 < 0.001
    assert kv_bytes_per_token(s, "bf16") == 28 * 4 * 128 * 2 * 2 == 57344
    assert s.sliding_window is None  # use_sliding_window: false


def test_qwen25_05b_params_tied():
    s = shape(QWEN05B)
    assert abs(s.total_params - 0.494e9) / 0.494e9 < 0.001
    assert s.lm_head_params == 0
    assert weight_bytes(s, "bf16") == 2 * s.total_params


def test_explicit_head_dim_and_nested_text_config():
    qwen3 = {"model_type": "qwen3", "text_config": dict(
        model_type="qwen3", hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936,
        max_position_embeddings=40960, tie_word_embeddings=True, torch_dtype="bfloat16")}
    s = shape(qwen3)
    assert s.head_dim == 128 and s.hidden_size == 1024  # 16 x 128 != 1024: the key wins
    assert kv_bytes_per_token(s, "bf16") == 28 * 8 * 128 * 2 * 2
    assert abs(s.total_params - 596_049_920) < 1e6  # Qwen3-0.6B


def test_sliding_window_rules():
    mistral = dict(SEED7B, model_type="mistral", num_key_value_heads=8,
                   max_position_embeddings=32768, sliding_window=4096)
    s = shape(mistral)
    assert s.sliding_window == 4096
    p = plan(s, "bf16", "bf16", 32768, 80 * GiB)
    assert p.max_context == 4096 and p.context == 4096 and p.notes
    assert p.kv_bytes == 4096 * kv_bytes_per_token(s, "bf16")
    assert shape(dict(mistral, sliding_window=32768)).sliding_window is None
    assert shape(dict(mistral, use_sliding_window=False)).sliding_window is None


GEMMA3_12B = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
              "text_config": dict(
                  model_type="gemma3_text", hidden_size=3840, num_hidden_layers=48,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=256,
                  intermediate_size=15360, vocab_size=262208, max_position_embeddings=131072,
                  sliding_window=1024, query_pre_attn_scalar=256, torch_dtype="bfloat16",
                  rope_scaling={"rope_type": "linear", "factor": 8.0})}


def test_gemma3_12b_at_4_bit_fits_24_gib_past_its_window():
    """Gemma 3's local layers are masked to their window, so the window does not cap the
    context; they keep only a ring of blocks a sequence (the window and the prefill pass), so
    the planner counts the 8 global layers at the context and the 40 local ones at the ring."""
    s = shape(GEMMA3_12B)
    assert s.model_type == "gemma3_text" and s.sliding_window is None and s.tie_word_embeddings
    assert (s.local_layers, s.local_window) == (40, 1024)  # every sixth layer global
    # four norms a layer and the q/k head norms: 48 (4 x 3840 + 2 x 256) + 3840
    assert s.other_params == 48 * (4 * 3840 + 2 * 256) + 3840
    assert abs(s.total_params - 11.77e9) < 0.01e9  # the language model of the 12B checkpoint
    layer = 2 * 8 * 256 * 2  # (K, V) x KV heads x head_dim x bf16 bytes: a token of a layer
    assert kv_bytes_per_token(s, "bf16") == 48 * layer == 384 * 1024
    ring = -(-(1024 + 512 - 1) // 16) * 16  # 96 blocks: the window and a 512-token pass
    for context in (32768, 131072):
        p = plan(s, "nf4", "bf16", context, 24 * GiB)
        assert p.context == context and p.prefill_chunk == 512
        assert p.kv_bytes == 8 * layer * context + 40 * layer * ring  # 2.47 GiB; 8.47 GiB
        assert p.fits and p.total_bytes < 24 * GiB
        assert any("40 of 48 layers attend within 1,024 tokens" in n for n in p.notes)
    assert p.max_context == 131072  # the whole native context fits a 24 GiB card at 4-bit
    # a longer pass, a larger ring; two sequences, two rings
    assert plan(s, "nf4", "bf16", 32768, prefill_chunk=2048).kv_bytes == \
        8 * layer * 32768 + 40 * layer * -(-(1024 + 2047) // 16) * 16
    assert plan(s, "nf4", "bf16", 32768, concurrency=2).kv_bytes == \
        2 * (8 * layer * 32768 + 40 * layer * ring)
    # Gemma 2 (no layer_types in its config): every other layer local, from the first
    assert shape(dict(GEMMA3_12B["text_config"], model_type="gemma2",
                      sliding_window=4096)).local_layers == 24


def test_bad_configs_raise_plan_error():
    with pytest.raises(PlanError, match="hidden_size"):
        shape({"num_hidden_layers": 2})
    with pytest.raises(PlanError):
        shape(dict(QWEN7B, num_key_value_heads=5))
    with pytest.raises(PlanError, match="gptq"):
        shape(dict(QWEN7B, quantization_config={"quant_method": "gptq"}))
    with pytest.raises(PlanError, match="longer than"):
        plan(shape(QWEN7B), "bf16", "bf16", 65536)


# ---------------------------------------------------------------- formats


def test_weight_formats_by_hand():
    s = shape(dict(QWEN05B, num_hidden_layers=1, tie_word_embeddings=False))
    kept16 = 2 * (s.embed_params + s.lm_head_params + s.other_params)
    lin = [(o, i, n) for o, i, n in s.linears]
    n_lin = sum(o * i * n for o, i, n in lin)
    assert weight_bytes(s, "fp32") == 2 * weight_bytes(s, "bf16")
    assert weight_bytes(s, "int8") == kept16 + n_lin + sum(4 * o * n for o, _, n in lin)
    nf4 = kept16 + sum(n * (o * i // 2 + 4 * (o * i // 64) + 64) for o, i, n in lin)
    assert weight_bytes(s, "nf4", double_quant=False) == nf4
    dq = weight_bytes(s, "nf4", double_quant=True)  # the engine's own layer: a bf16 absmax
    assert dq < nf4 and abs((dq - kept16) / n_lin - (0.5 + 2 / 64)) < 0.002
    # the engine's int4 layer: 4-bit codes, a 16-bit scale and offset per group and output
    awq = kept16 + sum(n * (i * o // 2 + (i // 128) * 4 * o) for o, i, n in lin)
    assert weight_bytes(s, "awq") == awq


def test_tied_embeddings_counted_once_and_kept_16_bit():
    tied, untied = shape(QWEN05B), shape(dict(QWEN05B, tie_word_embeddings=False))
    emb = 151936 * 896
    for q in ("bf16", "int8", "nf4", "awq"):
        assert weight_bytes(untied, q) - weight_bytes(tied, q) == 2 * emb


def test_kv_dtypes_and_scales():
    s = shape(QWEN7B)
    assert kv_bytes_per_token(s, "fp8") == 28 * 4 * 2 * (128 + 8)  # + an fp16 scale per 32 values
    assert kv_bytes_per_token(s, "int8") == kv_bytes_per_token(s, "fp8")
    mqa = shape(dict(SEED7B, num_key_value_heads=1))
    assert kv_bytes_per_token(mqa, "bf16") * 32 == kv_bytes_per_token(shape(SEED7B), "bf16")


# ---------------------------------------------------------------- safetensors refinement


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A header-only safetensors file: the planner reads the header, never the data."""
    size = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4}
    header, off = {}, 0
    for name, (dt, shp) in tensors.items():
        n = size[dt]
        for d in shp:
            n *= d
        header[name] = {"dtype": dt, "shape": shp, "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


def qwen2_tensors(cfg: dict, dt: str = "BF16", vocab: int | None = None) -> dict:
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], vocab or cfg["vocab_size"]
    q, k = cfg["num_attention_heads"] * (h // cfg["num_attention_heads"]), \
        cfg["num_key_value_heads"] * (h // cfg["num_attention_heads"])
    t = {"model.embed_tokens.weight": (dt, [v, h]), "model.norm.weight": (dt, [h])}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name, shp in (("self_attn.q_proj", [q, h]), ("self_attn.k_proj", [k, h]),
                          ("self_attn.v_proj", [k, h])):
            t[p + name + ".weight"], t[p + name + ".bias"] = (dt, shp), (dt, shp[:1])
        t[p + "self_attn.o_proj.weight"] = (dt, [h, q])
        t[p + "mlp.gate_proj.weight"] = t[p + "mlp.up_proj.weight"] = (dt, [inter, h])
        t[p + "mlp.down_proj.weight"] = (dt, [h, inter])
        t[p + "input_layernorm.weight"] = t[p + "post_attention_layernorm.weight"] = (dt, [h])
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = (dt, [v, h])
    return t


def test_from_folder_refines_from_safetensors(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(QWEN05B, torch_dtype=None)))
    tensors = qwen2_tensors(QWEN05B, vocab=151936 + 64)  # a padded embedding the config hides
    names = list(tensors)
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors",
                      {n: tensors[n] for n in names[:100]})
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors",
                      {n: tensors[n] for n in names[100:]})
    s = ModelShape.from_folder(tmp_path)
    assert s.param_source == "safetensors" and s.native_dtype == "bf16"
    assert s.total_params == shape(QWEN05B).total_params + 64 * 896
    assert s.checkpoint_bytes == 2 * s.total_params


def test_from_folder_awq_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(QWEN05B, **AWQ)))
    t = {}
    for name, (dt, shp) in qwen2_tensors(QWEN05B, "F16").items():
        if len(shp) == 2 and "embed" not in name:  # AWQ: qweight [in, out/8], scales, qzeros
            base = name.removesuffix(".weight")
            t[base + ".qweight"] = ("I32", [shp[1], shp[0] // 8])
            t[base + ".qzeros"] = ("I32", [shp[1] // 128, shp[0] // 8])
            t[base + ".scales"] = ("F16", [shp[1] // 128, shp[0]])
        else:
            t[name] = (dt, shp)
    write_safetensors(tmp_path / "model.safetensors", t)
    s = ModelShape.from_folder(tmp_path)
    assert s.quant_method == "awq" and s.param_source == "safetensors"
    assert s.total_params == shape(QWEN05B).total_params
    # on the card each group's 4-bit zeros and fp16 scales become a 16-bit scale and offset:
    # the checkpoint's bytes plus 1.5 a group and output
    groups_outputs = sum(n * (i // 128) * o for o, i, n in s.linears)
    assert weight_bytes(s, "awq") == s.checkpoint_bytes + groups_outputs * 3 // 2
    assert recommend(s, RTX4090, (8, 9), 4096).quant == "awq"


def test_config_arithmetic_matches_real_checkpoints(tiny_models):
    """transformers-saved tiny models of every supported family: config count == tensors."""
    for arch, folder in tiny_models.items():
        cfg = json.loads((folder / "config.json").read_text())
        refined = ModelShape.from_folder(folder)
        assert refined.param_source == "safetensors", arch
        assert shape(cfg).total_params == refined.total_params, arch


def test_from_folder_bad_input(tmp_path):
    with pytest.raises(PlanError, match="does not exist"):
        ModelShape.from_folder(tmp_path / "nope")
    with pytest.raises(PlanError, match="no config.json"):
        ModelShape.from_folder(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(PlanError, match="JSON"):
        ModelShape.from_folder(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(QWEN05B))
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(PlanError, match="safetensors"):
        ModelShape.from_folder(tmp_path)


# ---------------------------------------------------------------- plan


def test_plan_components_and_max_context():
    s = shape(QWEN7B)
    p = plan(s, "bf16", "bf16", 8192, 20 * GiB)
    parts = (p.weights_bytes, p.kv_bytes, p.activation_bytes, p.cuda_context_bytes,
             p.graph_pool_bytes, p.draft_bytes, p.margin_bytes)
    assert p.total_bytes == sum(parts) and all(isinstance(x, int) for x in parts)
    assert p.cuda_context_bytes == CUDA_CONTEXT_BYTES and p.margin_bytes == margin_bytes(20 * GiB)
    assert p.fits and p.recommended["quant"] == "bf16"
    m = plan(s, "bf16", "bf16", 1024, 17 * GiB).max_context
    assert 0 < m < 32768  # memory, not the model, bounds it here: the boundary is exact
    assert plan(s, "bf16", "bf16", m, 17 * GiB).fits
    assert not plan(s, "bf16", "bf16", m + 1, 17 * GiB).fits
    assert plan(s, "bf16", "bf16", 1024).fits is None  # no card: no verdict
    assert json.loads(json.dumps(p.to_dict()))["kv_bytes_per_token"] == 57344


def test_draft_adds_weights_and_kv():
    s, d = shape(QWEN7B), shape(QWEN05B)
    p = plan(s, "bf16", "bf16", 4096, 24 * GiB, draft=d)
    assert p.draft_bytes == weight_bytes(d, "bf16") + 4096 * kv_bytes_per_token(d, "bf16")
    r = recommend(s, 16 * GiB, (8, 9), 32768, draft=d)
    assert r.fits and r.plan.fits


# ---------------------------------------------------------------- the decision tree


def test_seed_a100_7b_is_16_bit_and_says_how_many_sequences_fit():
    s = shape(SEED7B)
    r = recommend(s, A100_80G, (8, 0), 4096, concurrency=256)
    assert r.quant in ("bf16", "fp16") and r.fits
    # 256 sequences of 4K at 0.5 MiB/token need 512 GiB of KV; the rest of the card holds:
    per_seq = kv_bytes_per_token(s, "bf16") * 4096
    assert per_seq == 2 * GiB
    p1 = plan(s, "bf16", "bf16", 4096, A100_80G)
    free = A100_80G - (p1.total_bytes - p1.kv_bytes)
    assert r.concurrency == r.plan.max_concurrency == free // per_seq == 32
    assert "256 sequences" in r.note and "32 do" in r.note


def test_seed_a100_72b_awq():
    r = recommend(shape(dict(QWEN72B, **AWQ)), A100_80G, (8, 0), 4096)
    assert (r.quant, r.fits) == ("awq", True)


def test_seed_4090_7b_awq_and_long_context():
    assert recommend(shape(dict(SEED7B, **AWQ)), RTX4090, (8, 9), 4096).quant == "awq"
    r = recommend(shape(SEED7B), RTX4090, (8, 9), 32768)  # 16 GiB of fp16 KV at 32K
    assert r.fits and (r.quant in ("nf4", "awq") or r.kv_dtype in ("fp8", "int8"))
    assert r.context == 32768


def test_seed_4090_72b_needs_two_cards():
    for cfg in (dict(QWEN72B, **AWQ), QWEN72B):
        r = recommend(shape(cfg), RTX4090, (8, 9), 4096)
        assert r.fits is False and r.cards_needed == 2
        assert "tp=2" in r.note and "offload" in r.note
        assert r.min_vram_bytes > RTX4090


def test_tree_order_and_cpu():
    s = shape(QWEN7B)
    assert recommend(s, 80 * GiB, (7, 5), 4096).quant == "fp16"  # Turing: no bf16
    r = recommend(s, 16 * GiB, (8, 6), 32768, prefer_quality=True)
    assert (r.quant, r.fits) == ("int8", True)
    assert recommend(s, 16 * GiB, (8, 6), 32768).quant == "nf4"
    r = recommend(s, 7 * GiB, (8, 6), None)  # nf4 fits only a shorter context
    assert r.fits and r.quant == "nf4" and r.kv_dtype == "int8" and r.context < 32768
    assert "shortened" in r.note and r.plan.fits
    cpu = recommend(shape(dict(QWEN7B, torch_dtype="float32")), None)
    assert (cpu.device, cpu.quant, cpu.fits) == ("cpu", "fp32", None)


# ---------------------------------------------------------------- properties

shapes = st.builds(
    lambda layers, heads, group, hd, mult, vocab: shape(dict(
        model_type="llama", hidden_size=heads * hd, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads // group, head_dim=hd,
        intermediate_size=heads * hd * mult // 2, vocab_size=vocab,
        max_position_embeddings=131072)),
    st.integers(2, 64), st.sampled_from([8, 16, 32, 64]), st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([64, 128]), st.integers(4, 8), st.integers(1000, 256000))


@settings(max_examples=60, deadline=None)
@given(shapes, st.integers(1, 160), st.integers(1, 160))
def test_max_context_monotone(s, a, b):
    small, big = sorted((a * GiB // 2, b * GiB // 2))
    for q in ("bf16", "int8", "nf4"):
        assert plan(s, q, "bf16", 1024, small).max_context <= plan(s, q, "bf16", 1024,
                                                                   big).max_context
    ctx = [plan(s, q, "bf16", 1024, big).max_context for q in ("bf16", "int8", "nf4")]
    assert ctx == sorted(ctx)  # a larger format never gets a longer context


@settings(max_examples=60, deadline=None)
@given(shapes, st.integers(1, 160), st.sampled_from([None, (7, 5), (8, 0), (8, 9)]))
def test_recommendations_fit(s, half_gib, cc):
    r = recommend(s, half_gib * GiB // 2, cc)
    if r.fits:
        assert r.plan.fits
        assert plan(s, r.quant, r.kv_dtype, r.context, half_gib * GiB // 2).fits


# ---------------------------------------------------------------- hearth plan


@pytest.fixture
def q7_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN7B))
    return tmp_path


def test_run_plan_json(q7_folder, capsys):
    assert plan_report.run_plan(str(q7_folder), vram_gib=24, as_json=True) == 0
    out = json.loads(capsys.readouterr().out)  # exactly one object
    for key in ("weights_bytes", "kv_bytes_per_token", "kv_bytes", "total_bytes"):
        assert isinstance(out[key], int)
    assert out["fits"] is True and out["max_context"] == 32768
    assert out["recommended"]["quant"] == "bf16" and out["kv_bytes_per_token"] == 57344


NO_GPU = GpuReport((), "no NVIDIA driver is installed; CPU mode")
A_GPU = GpuReport((GpuInfo(index=0, name="NVIDIA GeForce RTX 4090", uuid="GPU-0",
                           total_bytes=24 * GiB, free_bytes=23 * GiB, used_bytes=GiB,
                           compute_capability=(8, 9), driver_version="550.54.15",
                           supports_bf16=True, supports_fp8=True),))


def test_run_plan_human_and_no_card(q7_folder, capsys, monkeypatch):
    monkeypatch.setattr(plan_report, "detect_gpus", lambda: A_GPU)  # a GPU, but none asked for
    assert plan_report.run_plan(str(q7_folder), context=4096, quant="nf4") == 0
    out = capsys.readouterr().out
    assert "nf4 weights" in out and "total" in out


def test_run_plan_does_not_fit_exits_2_with_plan(q7_folder, capsys):
    assert plan_report.run_plan(str(q7_folder), vram_gib=4, as_json=True) == 2
    cap = capsys.readouterr()
    assert json.loads(cap.out)["fits"] is False
    assert len(cap.err.strip().splitlines()) == 1 and "Traceback" not in cap.err


@pytest.mark.parametrize("case", ["missing", "no_config", "bad_json", "bad_quant", "bad_vram",
                                  "bad_context"])
def test_run_plan_bad_input(tmp_path, q7_folder, capsys, case):
    folder, kw = str(q7_folder), {}
    if case == "missing":
        folder = str(tmp_path / "missing")
    elif case == "no_config":
        (q7_folder / "config.json").unlink()
    elif case == "bad_json":
        (q7_folder / "config.json").write_text("{")
    kw = {"bad_quant": {"quant": "int3"}, "bad_vram": {"vram_gib": -1},
          "bad_context": {"context": 0}}.get(case, {})
    assert plan_report.run_plan(folder, **kw) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and len(cap.err.strip().splitlines()) == 1
    assert "Traceback" not in cap.err


@pytest.mark.parametrize("flags", [["--vram", "1e308"], ["--vram", "inf"], ["--vram", "-0"],
                                   ["--context", str(10**400)]])
def test_cli_plan_extreme_numbers_exit_2_in_one_line(q7_folder, capsys, flags):
    from engine.cli import cli

    assert cli.main(["plan", "--model", str(q7_folder), *flags]) == 2
    cap = capsys.readouterr()
    assert len(cap.err.strip().splitlines()) == 1 and "Traceback" not in cap.err
    assert cap.err.startswith("hearth")


def test_on_the_cpu_nothing_of_cudas_is_counted():
    s = shape(QWEN7B)
    gpu = plan(s, "bf16", "bf16", 4096, 40 * GiB)
    cpu = plan(s, "bf16", "bf16", 4096, 40 * GiB, device="cpu")
    assert (cpu.cuda_context_bytes, cpu.graph_pool_bytes) == (0, 0) and cpu.fits
    assert gpu.total_bytes - cpu.total_bytes >= CUDA_CONTEXT_BYTES
    assert cpu.weights_bytes == gpu.weights_bytes and cpu.kv_bytes == gpu.kv_bytes
    small = recommend(s, 4 * GiB, device="cpu")  # 15 GiB of bf16 weights in 4 GiB of RAM
    assert (small.device, small.fits) == ("cpu", False)
    assert "4.0 GiB of memory free" in small.note
    short = recommend(s, 16 * GiB, device="cpu")  # the weights fit; the whole 32K cache not
    assert short.fits and short.context < 32768 and "shortened" in short.note


@pytest.mark.parametrize("ram_gib, code, fits", [(64, 0, True), (8, 2, False)])
def test_run_plan_on_a_cpu_fits_against_the_computers_memory(q7_folder, capsys, monkeypatch,
                                                            ram_gib, code, fits):
    monkeypatch.setattr(plan_report, "detect_gpus", lambda: NO_GPU)
    monkeypatch.setattr(plan_report, "available_ram_bytes", lambda: ram_gib * GiB)
    for gpu in (None, "auto"):  # nothing asked, or a GPU asked for that is not there
        assert plan_report.run_plan(str(q7_folder), gpu=gpu, context=4096,
                                    as_json=True) == code
        out = json.loads(capsys.readouterr().out)
        assert (out["device"], out["fits"], out["vram_bytes"]) == ("cpu", fits, ram_gib * GiB)
        assert (out["cuda_context_bytes"], out["graph_pool_bytes"]) == (0, 0)
    assert plan_report.run_plan(str(q7_folder), context=4096) == code
    out = capsys.readouterr().out
    assert f"Runs on   the CPU, {ram_gib:.2f} GiB of memory free (no GPU: no NVIDIA" in out
    assert "CUDA" not in out and ("  fits" in out) == fits


def test_planner_modules_import_without_torch():
    code = ("import sys, engine.platform.gpu, engine.plan.memory, engine.tools.plan_report; "
            "engine.platform.gpu.detect_gpus(); "
            "bad = [m for m in ('torch', 'transformers', 'PySide6') if m in sys.modules]; "
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
