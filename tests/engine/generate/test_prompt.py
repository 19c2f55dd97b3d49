"""prompt.py on the tokenizer alone: earlier answers keep their generated ids, a regenerate
re-tokenizes nothing the template rendered, and the oldest turns go when the context is full."""

from __future__ import annotations

import pytest

from engine.events import GenerateRequest
from engine.generate.prompt import build


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


def render(tok, messages) -> list[int]:
    text = tok.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def byte_ids(tok, text: str) -> list[int]:
    """A valid but non-canonical tokenization of `text`: one token a character (ASCII)."""
    ids = [tok(c, add_special_tokens=False)["input_ids"] for c in text]
    assert all(len(i) == 1 for i in ids)
    return [i[0] for i in ids]


QUESTION = ({"role": "user", "content": "What does zipfile do?"},)
ANSWER = "It reads and writes zip archives"


def test_an_answer_keeps_the_ids_the_model_generated(tok):
    prompt = render(tok, QUESTION)
    generated = byte_ids(tok, ANSWER)
    assert generated != tok(ANSWER, add_special_tokens=False)["input_ids"]  # BPE would merge
    turn2 = (*QUESTION, {"role": "assistant", "content": ANSWER},
             {"role": "user", "content": "And tarfile?"})
    ids, dropped = build(tok, GenerateRequest(messages=turn2), prompt + generated, 4096)
    assert dropped == 0
    assert ids[:len(prompt) + len(generated)] == prompt + generated
    assert tok.decode(ids) == tok.decode(render(tok, turn2))  # the same text all the same


def test_regenerate_and_an_unrelated_cache_tokenize_as_from_scratch(tok):
    prompt = render(tok, QUESTION)
    history = prompt + byte_ids(tok, ANSWER)
    assert build(tok, GenerateRequest(messages=QUESTION), history, 4096).ids == prompt
    other = ({"role": "user", "content": "What does tarfile do?"},)
    assert build(tok, GenerateRequest(messages=other), history, 4096).ids == render(tok, other)


def conversation(num_turns: int) -> list[dict]:
    messages = []
    for i in range(num_turns):
        messages += [{"role": "user", "content": f"Question {i}: what does module {i} do?"},
                     {"role": "assistant", "content": f"Module {i} does thing {i} well."}]
    return [*messages, {"role": "user", "content": "And the last one?"}]


def test_overflow_drops_the_oldest_turns_after_the_system_prompt(tok):
    messages = conversation(12)
    req = GenerateRequest(messages=tuple(messages), system="Be brief.", max_new_tokens=16)
    full = build(tok, req, [], 4096)
    assert full.dropped_messages == 0
    context = len(full.ids) // 2
    ids, dropped = build(tok, req, [], context)
    assert dropped > 0 and dropped % 2 == 0  # whole turns: a question and its answer
    assert len(ids) + 16 <= context
    kept = [{"role": "system", "content": "Be brief."}, *messages[dropped:]]
    assert ids == render(tok, kept)
    # the fewest dropped: one turn more would have fitted
    assert len(render(tok, [kept[0], *messages[dropped - 2:]])) + 16 > context


def test_only_the_question_left_when_nothing_else_fits(tok):
    messages = conversation(3)
    req = GenerateRequest(messages=tuple(messages), max_new_tokens=16)
    ids, dropped = build(tok, req, [], 8)  # too small even for the question
    assert dropped == len(messages) - 1
    assert ids == render(tok, messages[-1:])  # the session refuses it: longer than the context
