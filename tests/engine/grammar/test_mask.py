"""The grammar's next-token mask against an independent reference: every token of the tiny
tokenizer's vocabulary decoded and checked by brute force against the small language itself
(a finite set of words, listed here, not the grammar engine's matcher), at every position of an
answer; eos exactly where a whole word is written. Rollback gives back the earlier masks; the
compile is cached across copies of one tokenizer; a grammar that does not compile is bad input
with the engine's reason."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoTokenizer

from engine.events import BadRequest, GrammarSpec
from engine.grammar import compiled
from engine.grammar.matcher import GrammarState, masked

CPU = torch.device("cpu")
# the language, every word of it written out: one to three of a-d, then perhaps a digit (no
# position forces one continuation, where the engine may keep one tokenization of it alone)
LETTERS = [a + b + c for a in "abcd" for b in ["", *"abcd"] for c in ["", *"abcd"]
           if b or not c]
WORDS = {w + d for w in LETTERS for d in ["", *"0123456789"]}
PREFIXES = {w[:k] for w in WORDS for k in range(len(w) + 1)}
REGEX = "[a-d]{1,3}[0-9]?"


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def reference(tok, written: str) -> torch.Tensor:
    """bool [V]: tokens whose text keeps `written` a prefix of some word; eos where it is one."""
    ref = torch.zeros(len(tok), dtype=torch.bool)
    for i in range(len(tok)):
        text = tok.decode([i])
        if i not in tok.all_special_ids and text and written + text in PREFIXES:
            ref[i] = True
    ref[tok.eos_token_id] = written in WORDS
    return ref


@pytest.mark.parametrize("answer", ["cab7", "da"])
def test_the_mask_equals_a_brute_force_reference_at_every_position(tok, answer):
    state = GrammarState(tok, len(tok), GrammarSpec("regex", REGEX), (tok.eos_token_id,))
    written = ""
    for ch in answer:  # one character a token: every prefix of the answer is a position
        allowed = state.allowed(CPU)
        assert torch.equal(allowed, reference(tok, written)), written
        (token,) = tok.encode(ch, add_special_tokens=False)
        assert allowed[token]
        state.accept(token)
        written += ch
    assert torch.equal(state.allowed(CPU), reference(tok, written))
    # "cab7" takes nothing more: the grammar is complete; "da" may go on
    assert state.complete_after(len(answer)) == (answer == "cab7")


def test_extra_eos_ids_are_allowed_where_the_grammars_eos_is(tok):
    other = 0  # a second eos id, as generation_config.json may list
    state = GrammarState(tok, len(tok), GrammarSpec("regex", "ab"),
                         (tok.eos_token_id, other))
    assert not state.allowed(CPU)[[other, tok.eos_token_id]].any()
    for t in tok.encode("ab", add_special_tokens=False):
        state.accept(t)
    allowed = state.allowed(CPU)
    assert allowed[other] and allowed[tok.eos_token_id] and int(allowed.sum()) == 2


def test_rollback_gives_back_the_earlier_masks(tok):
    state = GrammarState(tok, len(tok), GrammarSpec("regex", REGEX), (tok.eos_token_id,))
    ids = [tok.encode(c, add_special_tokens=False)[0] for c in "cab7"]
    seen = []
    for t in ids:
        seen.append(state.allowed(CPU).clone())
        state.accept(t)
    assert state.complete_after(4)
    state.rollback(3)  # back to "c"
    assert state.consumed == 1 and not state.complete_after(4)
    assert torch.equal(state.allowed(CPU), seen[1])
    for t in ids[1:]:
        state.accept(t)
    assert state.complete_after(4)


def test_rows_are_masked_together_as_each_alone(tok):
    states = [GrammarState(tok, len(tok), GrammarSpec("regex", r), ()) for r in ("cat", "[0-9]+")]
    logits = torch.randn(2, len(tok))
    together = masked(states, logits)
    for i, s in enumerate(states):
        alone = logits[i].masked_fill(~s.allowed(CPU), float("-inf"))
        assert torch.equal(together[i], alone)


def test_a_grammar_compiles_once_for_every_copy_of_a_tokenizer(tok):
    spec = GrammarSpec.from_schema({"type": "object", "properties": {"n": {"type": "integer"}}})
    first = compiled.compile(tok, len(tok), spec)
    assert compiled.compile(copy.deepcopy(tok), len(tok), spec) is first
    assert compiled.compile(tok, len(tok) + 64, spec) is not first  # another mask width


@pytest.mark.parametrize("spec, reason", [
    (GrammarSpec("json_schema", '{"type": "frog"}'), "frog"),
    (GrammarSpec("json_schema", '{"properties": {"a": {"$ref": "#/nowhere"}}}'), "nowhere"),
    (GrammarSpec("json_schema", "[1"), "not valid JSON"),
    (GrammarSpec("regex", "a(b"), "unclosed group"),
    (GrammarSpec("lark", "start: missing_rule"), "missing_rule"),
    (GrammarSpec("xml"), "unknown grammar kind"),
])
def test_a_grammar_that_does_not_compile_is_bad_input_with_the_reason(tok, spec, reason):
    with pytest.raises(BadRequest, match=reason) as e:
        compiled.compile(tok, len(tok), spec)
    assert "\n" not in str(e.value)


def test_the_workers_json_lines_carry_a_requests_grammar():
    from engine.events import GenerateRequest, request_from_json, request_to_json

    req = GenerateRequest(prompt="x", grammar=GrammarSpec.from_schema({"type": "object"}))
    assert request_from_json(request_to_json(req)) == req
    with pytest.raises(BadRequest, match="grammar.kind"):
        request_from_json('{"command": "generate", "prompt": "x", "grammar": {"kind": 3}}')
