"""The language model of a multimodal checkpoint, loaded alone: Gemma 3's 4B-27B checkpoints are
Gemma3ForConditionalGeneration, a vision tower beside a text model Hearth runs as
Gemma3ForCausalLM. Its weights are read under their own prefix (`language_model.model.` as the
Hub's files spell it, `model.language_model.` as transformers 5 names the module); the vision
tower's stay on disk. Also the attention implementation a class loads with: SDPA, but where
transformers refuses it for the class."""

from __future__ import annotations

# the wrapper class -> its language model's weight names, as the causal LM's
KEY_MAPPINGS = {
    "Gemma3ForConditionalGeneration": {
        r"^language_model\.model\.": "model.",
        r"^model\.language_model\.": "model.",
        r"^language_model\.lm_head\.": "lm_head.",
    },
}


# transformers refuses SDPA for these (it cannot soft-cap); the engine's attention replaces
# whichever is loaded at once (load/loader.py)
EAGER_ONLY = ("Gemma2ForCausalLM",)


def text_config(config):
    """The config the engine builds: a wrapper's text model's, else the config itself."""
    architectures = getattr(config, "architectures", None) or ()
    wrapped = any(a in KEY_MAPPINGS for a in architectures)
    return config.get_text_config() if wrapped else config


def attention(architecture: str) -> str:
    return "eager" if architecture in EAGER_ONLY else "sdpa"


def from_pretrained(path, architecture: str, **kwargs):
    """-> (model, loading info) as AutoModelForCausalLM.from_pretrained(output_loading_info=True)
    gives them; a wrapper's language model alone, its weights found by their prefix."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = {**kwargs, "attn_implementation": attention(architecture)}
    mapping = KEY_MAPPINGS.get(architecture)
    if mapping is None:
        return AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, **kwargs)
    config = AutoConfig.from_pretrained(path, trust_remote_code=False).get_text_config()
    model, info = AutoModelForCausalLM.from_pretrained(
        path, config=config, key_mapping=mapping, output_loading_info=True, **kwargs)
    return model, info


def from_config(config, architecture: str, **kwargs):
    """A model of random weights from `config` (a wrapper's: its text config, text_config)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(config, attn_implementation=attention(architecture),
                                            **kwargs)
