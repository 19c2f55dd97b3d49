"""`hearth import` of a Gemma 3 GGUF (tests/fixtures/gemma_gguf.py: written as llama.cpp writes
one, norms stored as 1 + weight, the head tied, the global layers' RoPE scaled x8 in the header)
runs as the safetensors checkpoint of the same weights: fp32 greedy token for token on the
engine's own step, from the same prompt ids several sliding windows long (the tokenizer is the
import's other half, tested in test_gguf_tokenizer.py). The checkpoint's weights are bf16, so
the import's 16-bit copy holds them exactly."""

from __future__ import annotations

import json

import pytest

from engine.events import GenerateRequest, LoadRequest, SamplingParams
from engine.files.gguf_check import BadGGUF, check
from engine.files.gguf_import import import_gguf
from engine.generate.session import Session
from engine.models.gemma_step import GemmaStep
from tests.engine.helpers import PROMPT, greedy_request, token_ids
from tests.fixtures import gemma, gemma_gguf

LONG_PROMPT = (PROMPT + " ") * 5
N_NEW = 32


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer_dir):
    root = tmp_path_factory.mktemp("gemma3_gguf")
    layers = list(gemma_gguf.LAYER_TYPES)
    checkpoint = gemma.build(root / "checkpoint", tokenizer_dir, dtype="bfloat16",
                             layer_types=layers, num_hidden_layers=len(layers),
                             query_pre_attn_scalar=16, final_logit_softcapping=None)
    path = gemma_gguf.write(checkpoint, root / "tiny-gemma3.gguf")
    return checkpoint, import_gguf(path, root / "imported", lambda _event: None)


def test_a_gemma3_file_without_its_norm_after_the_mlp_is_refused(folders, tmp_path):
    path = gemma_gguf.write(folders[0], tmp_path / "t.gguf", drop=("blk.3.post_ffw_norm.weight",))
    with pytest.raises(BadGGUF, match=r"lacks tensor blk\.3\.post_ffw_norm\.weight"):
        check(path)


def test_the_import_states_the_files_model(folders):
    checkpoint, imported = folders
    want, got = (json.loads((f / "config.json").read_text()) for f in folders)
    assert got["architectures"] == ["Gemma3ForCausalLM"] and got["tie_word_embeddings"]
    for key in ("layer_types", "sliding_window", "head_dim", "query_pre_attn_scalar",
                "rope_parameters", "num_key_value_heads"):
        assert got[key] == want[key], key
    assert not (imported / "model.safetensors").read_bytes().count(b"lm_head")  # tied


def test_fp32_greedy_equals_the_safetensors_checkpoint(folders, one_thread):
    runs, ids = [], None
    for folder in folders:
        session = Session.load(LoadRequest(str(folder), device="cpu", quant="fp32",
                                           context=512))
        assert isinstance(session.decoder.family, GemmaStep)
        ids = ids or tuple(session.prompt_ids(greedy_request(LONG_PROMPT)))
        assert len(ids) >= 4 * gemma.WINDOW
        request = GenerateRequest(prompt_ids=ids, max_new_tokens=N_NEW,
                                  sampling=SamplingParams(temperature=0.0))
        runs.append(token_ids(list(session.generate(request))))
    assert len(set(runs[0])) >= 8  # the random model wanders: a wrong layer would show
    assert runs[1] == runs[0]
