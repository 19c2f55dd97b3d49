"""Random quantized models for an emulated small card are built on meta and given memory layer by
layer: every tensor ends on the device, the lm_head stays tied where the config ties it, the rotary
tables equal a normally built model's, and the model computes finite logits. On CPU the layer
factory is a plain linear (bitsandbytes quantizes only on a GPU)."""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from engine.files.model_folder import DEMO_MODEL_DIR
from engine.load import weight_loaders


def plain(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.nn.Linear:
    layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None,
                            device="meta")
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        layer.bias = torch.nn.Parameter(bias, requires_grad=False)
    return layer


def test_a_random_model_built_on_meta_is_whole_tied_and_computes(tiny_models):
    for path in (DEMO_MODEL_DIR, tiny_models["llama"]):  # tied (Qwen2 demo) and untied
        config = AutoConfig.from_pretrained(path)
        made = []
        model = weight_loaders.NF4.on_meta(
            config, torch.device("cpu"), torch.float32,
            make_layer=lambda w, b, made=made: made.append(w.shape) or plain(w, b))
        assert len(made) == 7 * config.num_hidden_layers  # q k v o gate up down, not the head
        assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
        tied = config.tie_word_embeddings
        head, embed = model.get_output_embeddings().weight, model.get_input_embeddings().weight
        assert (head.data_ptr() == embed.data_ptr()) == tied
        reference = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        assert torch.equal(model.model.rotary_emb.inv_freq, reference.model.rotary_emb.inv_freq)
        std = config.initializer_range
        w = model.model.layers[0].mlp.up_proj.weight
        assert abs(w.std().item() - std) < 0.1 * std  # the initializer's scale, not garbage
        logits = model(input_ids=torch.tensor([[5, 6, 7]])).logits
        assert torch.isfinite(logits).all()
