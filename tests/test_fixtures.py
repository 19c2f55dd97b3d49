"""The tiny offline fixtures are what the rest of the suite assumes they are."""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tests.fixtures import tiny

ROUND_TRIP = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "  leading spaces, trailing spaces  ",
    "tabs\tand\nnew\r\nlines\n\n\nand  double  spaces",
    "def f(x):\n    return x ** 2  # comment\n",
    "今天天气很好，我们去公园散步吧。",
    "混合 mixed 文本 text 123 ４５６",
    "😀🚀🔥 family 👨‍👩‍👧‍👦 flags 🇨🇳🇺🇸 skin 👋🏽 keycap 1️⃣",
    "日本語 한국어 Ελληνικά Русский العربية עברית हिन्दी",
    "rare: \x00\x07\x7f \u200b\u2028 \ufeff 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \U0010ffff",
    "",
    " ",
    "<|im_start|>user\nhi<|im_end|>\n",
]
NOT_NFC = "cafe\u0301 and n\u0303"  # decomposed accents


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: Path):
    return AutoTokenizer.from_pretrained(tokenizer_dir)


def test_special_tokens(tokenizer) -> None:
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in tiny.SPECIAL_TOKENS}
    assert ids == {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id == 0
    assert tokenizer.bos_token is None
    assert len(tokenizer) == tiny.VOCAB_SIZE
    assert tokenizer("hello")["input_ids"] == tokenizer.encode("hello", add_special_tokens=False)
    assert tokenizer.encode("<|im_start|><|im_end|>") == [1, 2]


@pytest.mark.parametrize("text", [*ROUND_TRIP, NOT_NFC])
def test_tokenizer_round_trip(tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids, skip_special_tokens=True) == text.replace(
        "<|im_start|>", ""
    ).replace("<|im_end|>", "")


def test_tokenizer_is_byte_level(tokenizer) -> None:
    chinese = tokenizer.encode("的")
    assert 1 <= len(chinese) <= 3  # bytes or merged bytes, never an unknown token
    assert tokenizer.decode(tokenizer.encode("😀")) == "😀"


def test_chat_template(tokenizer) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "你好 👋"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n你好 👋<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    bare = tokenizer.apply_chat_template(messages[1:], tokenize=False)
    assert bare == "<|im_start|>user\n你好 👋<|im_end|>\n"


@pytest.mark.parametrize("arch", tiny.ARCHITECTURES)
def test_model_folder_tokenizer(arch: str, tiny_models, tokenizer) -> None:
    # The qwen2 folder loads as transformers' Qwen2Tokenizer (it adds NFC): same ids for NFC text.
    tok = AutoTokenizer.from_pretrained(tiny_models[arch])
    assert tok.eos_token_id == 2 and tok.pad_token_id == 0 and tok.bos_token_id is None
    for text in ROUND_TRIP:
        assert tok.encode(text) == tokenizer.encode(text), text
        assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("arch", tiny.ARCHITECTURES)
def test_model_folder(arch: str, tiny_models, caplog: pytest.LogCaptureFixture) -> None:
    path = tiny_models[arch]
    names = sorted(p.name for p in path.iterdir())
    assert "model.safetensors" in names and "config.json" in names
    assert not [n for n in names if n.endswith((".bin", ".pt", ".pth", ".pkl"))]

    generation = json.loads((path / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [2, 0]
    assert generation["pad_token_id"] == 0 and generation["bos_token_id"] is None
    assert not {"do_sample", "temperature", "top_p", "top_k"} & generation.keys()

    with caplog.at_level(logging.WARNING):
        config = AutoConfig.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        tok = AutoTokenizer.from_pretrained(path)
    assert "remote code" not in caplog.text and "trust_remote_code" not in caplog.text

    assert config.model_type == arch
    assert config.eos_token_id == [2, 0] and config.pad_token_id == 0
    assert config.num_key_value_heads < config.num_attention_heads
    assert config.hidden_size % 64 == 0 and config.intermediate_size % 64 == 0
    assert getattr(config, "sliding_window", None) is None
    assert config.vocab_size == len(tok)
    assert sum(p.numel() for p in model.parameters()) < 5_000_000
    assert next(model.parameters()).dtype == torch.float32

    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Hello, who are you?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=64, do_sample=False)
    new = out[0, prompt["input_ids"].shape[1] :].tolist()
    assert len(new) == 64  # special tokens have zero output rows: greedy never stops early
    assert len(set(new)) >= 8


def test_bf16_model(tiny_model_bf16: Path) -> None:
    config = json.loads((tiny_model_bf16 / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and config["model_type"] == "qwen2"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_bf16, dtype="auto")
    assert next(model.parameters()).dtype == torch.bfloat16
    f32 = tiny_model_bf16.parent / "qwen2" / "model.safetensors"
    assert (tiny_model_bf16 / "model.safetensors").stat().st_size < f32.stat().st_size * 0.6


def test_bad_models(bad_models: dict[str, Path], tiny_model: Path) -> None:
    assert set(bad_models) == {
        "missing", "no_config", "unsupported_arch", "gguf", "gguf_file", "no_weights",
        "bin_only", "truncated", "corrupt_header", "no_tokenizer", "bad_config_json",
    }  # fmt: skip
    b = bad_models
    tokenizer_files = {"tokenizer.json", "tokenizer_config.json"}

    def names(key: str) -> set[str]:
        return {p.name for p in b[key].iterdir()}

    assert not b["missing"].exists()
    assert "config.json" not in names("no_config")
    assert {"model.safetensors", *tokenizer_files} <= names("no_config")

    mamba = json.loads((b["unsupported_arch"] / "config.json").read_text())
    assert mamba["architectures"] == ["MambaForCausalLM"] and mamba["model_type"] == "mamba"
    assert {"model.safetensors", *tokenizer_files} <= names("unsupported_arch")

    assert names("gguf") == {"model.Q4_K_M.gguf"}
    assert b["gguf_file"] == b["gguf"] / "model.Q4_K_M.gguf"
    assert b["gguf_file"].read_bytes()[:4] == b"GGUF"

    assert {"config.json", *tokenizer_files} <= names("no_weights")
    assert not [n for n in names("no_weights") if n.endswith((".safetensors", ".bin"))]

    assert {"config.json", "pytorch_model.bin", *tokenizer_files} <= names("bin_only")
    assert "model.safetensors" not in names("bin_only")
    bin_bytes = (b["bin_only"] / "pytorch_model.bin").read_bytes()
    assert bin_bytes[:1] != b"\x80" and bin_bytes[:2] != b"PK"  # neither a pickle nor a zip

    good = (tiny_model / "model.safetensors").read_bytes()
    cut = (b["truncated"] / "model.safetensors").read_bytes()
    assert len(cut) == len(good) // 2 and good.startswith(cut)

    bad = (b["corrupt_header"] / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", good[:8])
    assert len(bad) == len(good) and bad[:8] == good[:8] and bad[8 + n :] == good[8 + n :]
    with pytest.raises(ValueError):
        json.loads(bad[8 : 8 + n])
    json.loads(good[8 : 8 + n])

    assert not tokenizer_files & names("no_tokenizer")
    assert {"config.json", "model.safetensors"} <= names("no_tokenizer")

    with pytest.raises(ValueError):
        json.loads((b["bad_config_json"] / "config.json").read_text())
    assert {"model.safetensors", *tokenizer_files} <= names("bad_config_json")
