"""A request's Sampler, with its grammar where the request has one (GenerateRequest.grammar:
a JSON schema, json_object, a regex, a Lark grammar), else with its reader of the thinking where
the request asks it apart (GenerateRequest.thinking) and the model thinks. The grammar compiles
here at the latest (cached: the server compiled it on its own thread already), so a grammar
that cannot compile is bad input before the request takes a row. The grammar follows each token
the request keeps: a plain step's as the sampler takes it, a speculative round's drafted block
checked and rolled back to what the target accepted (spec/constrained_verify.py)."""

from __future__ import annotations

import torch

from engine.answer.reasoning import ReasoningReader, opens_thinking, thinks
from engine.events import GenerateRequest
from engine.generate.prompt import template_text
from engine.grammar.matcher import GrammarState
from engine.step.sampling import Sampler, resolve

# the prompt's last tokens, read back as text, show whether the template opened a thinking for
# the answer (the generation prompt, `<think>\n` in the R1 distills', is a few tokens long)
PROMPT_TAIL_TOKENS = 32


def sampler(lm, req: GenerateRequest, vocab: int, prompt: torch.Tensor) -> Sampler:
    """The Sampler of `req` on the loaded model `lm` (vocab: its logits' width)."""
    made = Sampler(resolve(req.sampling, lm.sampling_defaults), vocab, lm.device, prompt)
    if req.grammar is not None:  # a constrained answer is all content, from its first token
        made.grammar = GrammarState(lm.tokenizer, vocab, req.grammar, tuple(lm.eos_ids))
    elif req.thinking is not None and thinks(template_text(lm.tokenizer)):
        tail = lm.tokenizer.decode(prompt[-PROMPT_TAIL_TOKENS:].tolist(),
                                   skip_special_tokens=False)
        made.reading = ReasoningReader(opens_thinking(tail))
    return made


def complete(made: Sampler | None, n_new: int) -> bool:
    """Whether the answer's grammar was complete at its n_new-th token: it ends there."""
    grammar = made.grammar if made is not None else None
    return grammar is not None and grammar.complete_after(n_new)
