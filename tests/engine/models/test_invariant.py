"""The reproducible mode (models/invariant.py), as a property of each piece and of the step: the
same row inside inputs of 1 to 64 rows gives the same bits, for the fixtures' fast-path
families in fp32 and bf16 (and SmolLM2 in test_reproducible_smollm2.py). Without the mode the
step's products are not row-count independent here (the last test shows the cause)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.events import LoadRequest
from engine.generate.session import Session
from engine.models import invariant
from engine.models.layers import apply_linear
from engine.step.decode import bucket

ROW_COUNTS = (1, 2, 3, 7, 16, 17, 33, 64)
FAMILIES = ("llama", "qwen2", "qwen3")


def _rows(n: int, width: int, dtype, seed: int = 0) -> torch.Tensor:
    return torch.randn(1, n, width, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _session(folder, dtype: str = "fp32") -> Session:
    quant = "auto" if dtype == "fp32" else dtype
    return Session.load(LoadRequest(model=str(folder), device="cpu", quant=quant,
                                    reproducible=True))


@pytest.fixture(scope="module", params=[(f, d) for f in FAMILIES for d in ("fp32", "bf16")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def session(request, tiny_models):
    family, dtype = request.param
    return _session(tiny_models[family], dtype)


def test_each_linear_in_its_tiles_gives_every_row_its_own_bits(session):
    step = session.decoder.family
    p = step.layers[0]
    hidden = step.embed.shape[1]
    for kind, (w, bias, width) in {"qkv": (p.qkv, p.qkv_bias, hidden),
                                   "gate_up": (p.gate_up, None, hidden),
                                   "lm_head": (step.lm_head, None, hidden)}.items():
        x = _rows(64, width, step.embed.dtype)
        # as the mode runs them: one row as two (invariant.paired)
        product = invariant.paired(lambda t, w=w, bias=bias: apply_linear(t, w, bias))
        alone = torch.cat([product(x[:, i:i + 1]) for i in range(64)], dim=1)
        for n in ROW_COUNTS:
            got = invariant.tiled(x[:, :n], product, step.invariant.rows[kind])
            assert torch.equal(got, alone[:, :n]), (kind, n)


def test_norms_silu_and_rope_work_row_by_row(session):
    pieces_work_row_by_row(session.decoder.family, session.decoder.family.fns)


@pytest.mark.parametrize("start", [0, 230])  # 230: blocks across the 256 bucket's edge
def test_a_block_of_any_size_gives_each_row_its_decode_steps_bits(session, start):
    same_bits_as_steps(session, start)


def same_bits_as_steps(session, start: int, counts=ROW_COUNTS) -> None:
    """Every row's logits from blocks of 1 to 64 tokens equal, bit for bit, those of the decode
    steps that feed the same tokens one at a time (their K/V the block's own: the cache holds
    the same values either way, which the next block then reads)."""
    dec, step = session.decoder, session.decoder.family
    ids = torch.randint(3, step.embed.shape[0], (start + max(counts),),
                        generator=torch.Generator().manual_seed(start)).to(step.embed.device)
    session.cache.clear()
    if start:
        dec.forward(ids[:start], 0)
    singles = torch.stack([dec.step(ids[t:t + 1], t).clone()
                           for t in range(start, start + max(counts))])
    for n in counts:
        got = dec.verify(ids[start:start + n], start)  # a block: every row's logits
        assert torch.equal(got, singles[:n]), n
        last = dec.forward(ids[start:start + n], start)  # a prefill chunk: the last row's
        assert torch.equal(last, singles[n - 1]), n


def pieces_work_row_by_row(step, fns: dict) -> None:
    """rms (and the residual add with it), SiLU * up and the RoPE table, as `fns` run them
    (the eager pieces, or the fused Triton ones on a GPU): a row's bits whatever the rows."""
    dtype, hidden, device = step.embed.dtype, step.embed.shape[1], step.embed.device
    x, g = _rows(64, hidden, dtype).to(device), _rows(64, 2 * hidden, dtype, seed=1).to(device)
    d = _rows(64, hidden, dtype, seed=2).to(device)
    pos = torch.arange(64, device=device)
    cos, sin = step.rope_table(pos, dtype)
    for n in ROW_COUNTS:
        for i in (0, n - 1):
            assert torch.equal(fns["rms"](x[:, :n], step.norm)[:, i],
                               fns["rms"](x[:, i:i + 1], step.norm)[:, 0]), n
            summed, normed = fns["add_rms"](x[:, :n], d[:, :n], step.norm)
            one, one_normed = fns["add_rms"](x[:, i:i + 1], d[:, i:i + 1], step.norm)
            assert torch.equal(summed[:, i], one[:, 0]) and torch.equal(normed[:, i],
                                                                        one_normed[:, 0]), n
            assert torch.equal(fns["silu_mul"](g[:, :n])[:, i],
                               fns["silu_mul"](g[:, i:i + 1])[:, 0]), n
            c, s = step.rope_table(pos[i:i + 1], dtype)
            assert torch.equal(c[0], cos[i]) and torch.equal(s[0], sin[i])


def test_the_row_buckets_split_where_the_decode_bucket_changes():
    buckets = [256, 512, 1024]
    runs = invariant.row_buckets(250, 10, lambda end: bucket(buckets, end), 17)
    assert runs == [(0, 6, 256), (6, 10, 512)]  # positions 250..255 read 256 keys, 256.. 512
    runs = invariant.row_buckets(0, 40, lambda end: bucket(buckets, end), 17)
    assert runs == [(0, 17, 256), (17, 34, 256), (34, 40, 256)]  # no run past a verify block


def test_calibration_finds_the_tiles_this_cpu_keeps(tiny_models):
    """bf16 products keep every row's bits in tiles up to 16 rows on the machines this runs on
    (they are chosen by probing, so a machine where they do not gets smaller ones, not wrong
    answers); an fp32 product here does not even keep them in pairs."""
    s = _session(tiny_models["llama"], "bf16")
    assert all(1 <= r <= invariant.MAX_TILE for r in s.decoder.family.invariant.rows.values())
    x = _rows(4, 64, torch.bfloat16)
    w = torch.randn(96, 64, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    tile = invariant.largest_tile(lambda t: F.linear(t, w), 64, torch.bfloat16,
                                  torch.device("cpu"), (1, torch.get_num_threads()))
    assert tile >= 1 and torch.equal(invariant.tiled(x, lambda t: F.linear(t, w), tile),
                                     torch.cat([F.linear(x[:, i:i + 1], w) for i in range(4)], 1))


def test_the_mode_is_named_in_the_load_event_with_its_reason(tiny_models):
    on = _session(tiny_models["qwen2"])
    event = on.loaded_event()
    assert event.config["reproducible"] is True
    assert event.config["reproducible_reason"] == "as asked"
    assert any(n.startswith("reproducible: products in tiles") for n in event.notes)
    assert any("reproducible on (as asked)" in n for n in event.notes)
    off = Session.load(LoadRequest(model=str(tiny_models["qwen2"]), device="cpu"))
    assert off.config.reproducible is False and "default" in off.config.reproducible_reason
    # transformers' modules (Gemma here) cannot run it: asked for, a one-line refusal
    from engine.events import BadRequest

    with pytest.raises(BadRequest, match="--reproducible on cannot run here: gemma runs "
                                         "through transformers' modules"):
        _session(tiny_models["gemma"])


@pytest.mark.parametrize("value", [1, 0, "on", "yes"])
def test_reproducible_must_be_true_false_or_null(value):
    from engine.events import BadRequest

    with pytest.raises(BadRequest, match="reproducible is true, false or null"):
        LoadRequest(reproducible=value).validate()
