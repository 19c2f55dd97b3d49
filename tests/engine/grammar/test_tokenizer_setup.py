"""The grammar engine's view of a vocabulary is built when the server takes its model (on the
tokenizer's thread, in the background), so the first constrained request finds it built."""

from __future__ import annotations

import llguidance.hf
from transformers import AutoTokenizer

from engine.events import GrammarSpec
from engine.grammar import compiled
from engine.server.model_view import ModelView


def test_the_first_constrained_request_does_not_build_the_tokenizer(tokenizer_dir, monkeypatch):
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    monkeypatch.setattr(compiled, "_tokenizers", {})  # none built yet in this process
    built = []
    real = llguidance.hf.from_tokenizer
    monkeypatch.setattr(llguidance.hf, "from_tokenizer",
                        lambda *a, **kw: built.append(1) or real(*a, **kw))
    view = ModelView(tok, 512, len(tok), ("m",))
    try:
        assert view.grammar_ready.result(timeout=120) is True
        assert built == [1]
        spec = GrammarSpec.from_schema({"type": "object", "properties": {"a": {"enum": [1]}}})
        compiled.compile(view.tok, view.vocab_size, spec)  # as the chat route compiles
        compiled.compile(tok, len(tok), spec)  # and the engine, on its own copy
        assert built == [1]
    finally:
        view.close()
