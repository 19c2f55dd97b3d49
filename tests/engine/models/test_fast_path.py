"""The engine's own static-buffer decode step (layers.py) against transformers' modules: the
same tokens, greedy, and the same logits when teacher-forced, across KV-length buckets."""

from __future__ import annotations

import pytest
import torch

from engine.events import LoadRequest
from engine.generate.session import Session
from engine.step.decode import kv_buckets
from tests.engine.helpers import PROMPT, greedy_request, token_ids

FAMILY = ["llama", "mistral", "qwen2", "qwen3", "phi3"]


def test_buckets_cover_the_context():
    assert kv_buckets(8192) == [256, 512, 1024, 2048, 4096, 8192]
    assert kv_buckets(300) == [256, 300]
    assert kv_buckets(100) == [100]


@pytest.mark.parametrize("arch", FAMILY)
def test_static_step_equals_transformers_modules(arch, tiny_models):
    # context 300 and a ~250-token prompt: decode crosses from the 256 bucket into the 300 one
    prompt = (PROMPT + " ") * 13
    fast = Session.load(LoadRequest(str(tiny_models[arch]), device="cpu", context=300))
    ref = Session.load(LoadRequest(str(tiny_models[arch]), device="cpu", context=300, eager=True))
    assert fast.decoder.mode == "static" and ref.decoder.mode == "generic"
    n_prompt = len(fast.prompt_ids(greedy_request(prompt)))
    assert 200 < n_prompt < 256
    a = token_ids(list(fast.generate(greedy_request(prompt, n=40))))
    b = token_ids(list(ref.generate(greedy_request(prompt, n=40))))
    assert a == b and len(a) == 40


@pytest.mark.parametrize("arch", FAMILY)
def test_teacher_forced_logits_match(arch, tiny_models):
    fast = Session.load(LoadRequest(str(tiny_models[arch]), device="cpu", context=512))
    ref = Session.load(LoadRequest(str(tiny_models[arch]), device="cpu", context=512, eager=True))
    ids = torch.randint(3, 2048, (48,), generator=torch.Generator().manual_seed(7))
    fast.decoder.forward(ids[:8], 0)
    ref.decoder.forward(ids[:8], 0)
    for pos in range(8, 48):
        tok = ids[pos:pos + 1]
        a, b = fast.decoder.step(tok, pos), ref.decoder.step(tok, pos)
        # fp32 with a different summation order: far under 1e-5 relative to the logits' norm
        assert ((a - b).norm() / b.norm()).item() < 1e-5
        assert a.argmax() == b.argmax()


def test_other_architectures_say_why_they_are_generic(tiny_models):
    s = Session.load(LoadRequest(str(tiny_models["gemma"]), device="cpu"))
    assert s.decoder.mode == "generic"
    assert any("transformers' modules" in n for n in s.loaded_event().notes)


def test_compiled_pieces_equal_eager(tiny_models):
    # torch.compile of the pieces between linears (CPU inductor here): same tokens as eager
    path = str(tiny_models["qwen3"])  # qwen3: the per-head q/k norms are inside a piece
    eager = Session.load(LoadRequest(path, device="cpu"))
    compiled = Session.load(LoadRequest(path, device="cpu", compile=True))
    assert compiled.decoder.family.fns["rms"] is not eager.decoder.family.fns["rms"]
    a = token_ids(list(eager.generate(greedy_request(n=24))))
    assert a == token_ids(list(compiled.generate(greedy_request(n=24))))


def test_llama_with_attention_bias_is_not_sent_down_the_fused_step(tiny_models, tmp_path):
    import json
    import shutil

    from transformers import AutoModelForCausalLM

    folder = tmp_path / "llama_bias"
    shutil.copytree(tiny_models["llama"], folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["attention_bias"] = True
    (folder / "config.json").write_text(json.dumps(cfg))
    AutoModelForCausalLM.from_config(
        AutoModelForCausalLM.from_pretrained(folder).config).save_pretrained(folder)
    s = Session.load(LoadRequest(str(folder), device="cpu"))
    assert s.decoder.mode == "generic"
    ref = Session.load(LoadRequest(str(folder), device="cpu", eager=True))
    assert token_ids(list(s.generate(greedy_request(n=16)))) == token_ids(
        list(ref.generate(greedy_request(n=16))))
