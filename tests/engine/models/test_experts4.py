"""A mixture of experts loaded with --quant awq or nf4 (load/experts_quant.py): its experts
rounded to 4 bits at load and read by the grouped product, its other linears as the format
rounds them. On the CPU, tiny Qwen3-MoE and Mixtral folders (two layers, 8 experts, top-2,
experts 64 wide). The 4-bit step is as close to the same 4-bit weights run exactly (fp32,
transformers' modules) as transformers' own bf16 modules are, the dense formats' yardstick; its
answer stays near the 16-bit experts' one; rows of one batch routed to different experts give
what each gives alone."""

from __future__ import annotations

import json

import pytest
import torch

from engine.cli import cli
from engine.events import LoadRequest
from engine.generate.session import Session
from engine.kernels.experts.packed import Packed4
from engine.models import experts
from engine.models.moe_step import MoeStep
from engine.quant.experts4 import Experts4
from engine.quant.int4_linear import Int4Linear
from tests.engine.models.test_experts import assert_batched_rows_routed_apart_equal_each_alone
from tests.engine.models.test_gemma import _teacher_forced
from tests.fixtures import experts as fixture

CASES = (("qwen3_moe", "awq"), ("mixtral", "nf4"))
WIDTH = 64


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer_dir):
    root = tmp_path_factory.mktemp("experts4")
    return {kind: fixture.build(root / kind, tokenizer_dir, kind, width=WIDTH)
            for kind in ("qwen3_moe", "mixtral")}


@pytest.fixture(scope="module")
def sessions(folders, one_thread):
    return {(kind, quant): Session.load(LoadRequest(str(folders[kind]), device="cpu",
                                                    quant=quant))
            for kind, quant in CASES}


def _source(folder) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _dequantized(session: Session, folder) -> torch.nn.Module:
    """The folder's model in fp32 holding exactly the weights the 4-bit session multiplies by."""
    exact = _source(folder)
    for name, mod in session.lm.model.named_modules():
        if isinstance(mod, Experts4):
            target = exact.get_submodule(name)
            for proj in ("gate_up_proj", "down_proj"):
                p = getattr(mod, proj)
                getattr(target, proj).data = torch.stack([p[e].float()
                                                          for e in range(p.shape[0])])
        elif isinstance(mod, Int4Linear):
            exact.get_submodule(name).weight.data = mod.dequantize().float()
        elif type(mod).__name__ == "Linear4bit":
            import bitsandbytes.functional as bnbf

            w = bnbf.dequantize_4bit(mod.weight.data, mod.weight.quant_state)
            exact.get_submodule(name).weight.data = w.float()
    return exact


def _forced(model, ids: torch.Tensor, start: int) -> torch.Tensor:
    with torch.no_grad():
        return model(ids[None]).logits[0, start:].float()


@pytest.mark.parametrize("kind, quant", CASES)
def test_the_experts_load_in_4_bits_and_the_step_reads_them(kind, quant, sessions, folders):
    s = sessions[kind, quant]
    assert s.lm.quant == quant and isinstance(s.decoder.family, MoeStep)
    layer = s.decoder.family.layers[0].gate_up
    assert isinstance(layer, experts.ExpertMLP) and isinstance(layer.gate_up, Packed4)
    assert layer.gate_up.codebook == (quant == "nf4")
    model = s.lm.model
    kinds = {type(m).__name__ for m in model.modules()}
    assert "Experts4" in kinds and ("Int4Linear" if quant == "awq" else "Linear4bit") in kinds
    assert type(model.lm_head) is torch.nn.Linear  # the lm_head stays 16-bit, as dense formats
    size = lambda m: sum(p.numel() * p.element_size() for n, p in m.named_parameters()  # noqa
                         if ".experts." in n)
    bf16 = 2 * 2 * fixture.EXPERTS * 3 * WIDTH * 64  # two layers of [gate; up] and down
    assert size(model) < 0.3 * bf16  # 4 bits a weight, a bf16 scale (and offset) per group
    source = _source(folders[kind])
    for name, mod in model.named_modules():  # each expert's rounding of its own weights
        if isinstance(mod, Experts4):
            for proj in ("gate_up_proj", "down_proj"):
                got, want = getattr(mod, proj), getattr(source.get_submodule(name), proj)
                for e in range(fixture.EXPERTS):
                    # 4-bit rounding of these Gaussian weights: about 0.1; another expert's or
                    # gate and up swapped: above 1
                    assert (got[e].float() - want[e]).norm() < 0.15 * want[e].norm()


@pytest.mark.parametrize("kind, quant", CASES)
def test_logits_within_the_4_bit_yardstick(kind, quant, sessions, folders, one_thread):
    """Teacher-forced, against the same 4-bit weights dequantized exactly (fp32): no farther
    than transformers' modules in bf16 over those weights. (From the 16-bit experts' logits the
    rounding itself moves these random tiny models by about 0.3 relative, the step nothing more.)"""
    s = sessions[kind, quant]
    ids = torch.randint(3, 2048, (48,), generator=torch.Generator().manual_seed(5))
    fast = _teacher_forced(s, ids, 16)
    exact = _dequantized(s, folders[kind])
    want = _forced(exact, ids, 16)
    modules = _forced(exact.to(torch.bfloat16), ids, 16)
    # the 4-bit experts through transformers' modules (Experts4.forward in place of theirs)
    eager = _teacher_forced(Session.load(LoadRequest(str(folders[kind]), device="cpu",
                                                     quant=quant, eager=True)), ids, 16)
    rel = lambda a, b: ((a - b).norm(dim=-1) / b.norm(dim=-1)).median().item()  # noqa: E731
    assert 0 < rel(modules, want)
    assert rel(fast, want) <= 1.5 * rel(modules, want)
    assert rel(eager, want) <= 1.5 * rel(modules, want)


@pytest.mark.parametrize("kind, quant", CASES)
def test_batched_rows_routed_to_different_experts_equal_each_alone(kind, quant, sessions,
                                                                   monkeypatch):
    assert_batched_rows_routed_apart_equal_each_alone(sessions[kind, quant], monkeypatch, steps=3)


def test_random_4_bit_experts_from_config_alone(folders, tmp_path, one_thread):
    """`hearth bench --random-weights --quant awq`: the experts made random 4-bit ones on the
    device, never 16-bit (a 30B mixture's 16-bit experts fit no card the 4-bit ones are for)."""
    from engine.files.model_folder import config_only_folder
    from engine.load import loader

    config = json.loads((folders["qwen3_moe"] / "config.json").read_text())
    # widths of whole groups of 128, the random AWQ layers' group
    config.update(hidden_size=128, num_attention_heads=8, moe_intermediate_size=128)
    (tmp_path / "config.json").write_text(json.dumps(config))
    lm = loader.random_model(config_only_folder(str(tmp_path)),
                             LoadRequest(quant="awq", device="cpu"))
    assert lm.quant == "awq" and sum(isinstance(m, Experts4) for m in lm.model.modules()) == 2
    assert not any(".experts." in n and p.dtype.is_floating_point and p.dim() == 3
                   for n, p in lm.model.named_parameters()
                   if n.endswith("_proj"))  # no 16-bit [E, N, K] expert tensor left
    s = Session(lm)
    assert isinstance(s.decoder.family, MoeStep)
    logits = s.decoder.forward(torch.tensor([5, 6, 7]), 0)
    assert torch.isfinite(logits).all() and logits.std() > 0


def test_experts_no_group_divides_are_refused_in_one_sentence(tmp_path, tokenizer_dir, capsys):
    folder = fixture.build(tmp_path / "w48", tokenizer_dir, "qwen3_moe")  # experts 48 wide
    assert cli.main(["run", "--model", str(folder), "--quant", "nf4", "--prompt", "hi",
                     "--max-new-tokens", "1", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert not any("Traceback" in line for line in err)
    assert err[-1].endswith("nf4 groups input features by 64; this model's 48 are a multiple "
                            "of none"), err
