"""Train the demo models' byte-level BPE tokenizer once, on the training split; it is committed.

    python3 packaging/demo_model/build_tokenizer.py

The same kind of tokenizer as the test fixtures (tests/fixtures/tiny.py): Qwen2's split regex
over byte-level BPE, no normalizer (so decode(encode(s)) == s), special tokens <|endoftext|>,
<|im_start|>, <|im_end|> at ids 0, 1, 2, eos <|im_end|>, and the same chat template.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import corpus  # noqa: E402
import shape  # noqa: E402

VOCAB_SIZE = 4096  # a multiple of 64: the embedding is most of a 4M model, so keep it small
MAX_POSITIONS = 1024
SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def build(out_dir: Path) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=list(shape.SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    # cut the special tokens out of rendered chats: their characters must not become merges
    pattern = "|".join(re.escape(t) for t in shape.SPECIAL_TOKENS)
    texts = [piece for doc in shape.documents(corpus.load("train"), seed=0)
             for piece in re.split(pattern, doc) if piece]
    backend.train_from_iterator(texts, trainer=trainer)
    if backend.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"trained vocab is {backend.get_vocab_size()}, wanted {VOCAB_SIZE}")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=None, eos_token=shape.IM_END,
        pad_token=shape.ENDOFTEXT, unk_token=None, add_bos_token=False, add_eos_token=False,
        clean_up_tokenization_spaces=False, model_max_length=MAX_POSITIONS,
        chat_template=shape.CHAT_TEMPLATE)
    tokenizer.save_pretrained(out_dir)


if __name__ == "__main__":
    build(HERE / "tokenizer")
    print(f"wrote {HERE / 'tokenizer'}")
