"""Byte-safe streaming: multi-byte characters split over tokens come out whole."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from engine.generate.detokenizer import Detokenizer, StopMatcher

SAMPLES = ["中文测试：你好，世界！", "emoji 🎉👍🏽 mixed with text", "naïve café ☕ — 日本語"]


def stream(tok, s: str) -> list[str]:
    detok = Detokenizer(tok)
    return [detok.add(i) for i in tok(s, add_special_tokens=False)["input_ids"]]


def test_multibyte_text_round_trips_piece_by_piece(tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    split_somewhere = False
    for s in SAMPLES:
        pieces = stream(tok, s)
        assert "".join(pieces) == s
        assert not any("\ufffd" in p for p in pieces)
        split_somewhere |= "" in pieces  # a token that ended inside a character
    assert split_somewhere, "no sample split a character: the test would prove nothing"


@settings(max_examples=30, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")),
               max_size=40))
def test_any_text_round_trips(tokenizer_dir, s):
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    assert "".join(stream(tok, s)) == tok.decode(tok(s, add_special_tokens=False)["input_ids"])


@given(st.text(alphabet="abc", max_size=30), st.lists(st.integers(1, 5), max_size=10),
       st.text(alphabet="abc", min_size=1, max_size=3))
def test_stop_matcher_cuts_exactly_for_any_chunking(s, cuts, stop):
    chunks, i = [], 0
    for c in cuts:
        chunks.append(s[i:i + c])
        i += c
    chunks.append(s[i:])
    m = StopMatcher((stop,))
    out = ""
    for chunk in chunks:
        piece, stopped = m.feed(chunk)
        out += piece
        if stopped:
            break
    else:
        out += m.flush()
    assert out == (s[: s.find(stop)] if stop in s else s)
