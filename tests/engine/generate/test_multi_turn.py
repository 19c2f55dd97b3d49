"""Multi-turn reuse against recompute, token for token in fp32, over send / regenerate / edit /
crop sequences; cached versus computed prompt tokens in Stats; a chat outgrowing the context."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.events import GenerateRequest, LoadRequest, SamplingParams
from engine.generate.session import Session
from tests.engine.helpers import answer_against_recompute, finished, text

GREEDY = SamplingParams(temperature=0.0)
SYSTEM = "Be brief."
WORDS = ("zipfile", "tarfile", "json", "csv", "heapq", "bisect")


@pytest.fixture(scope="module")
def session(tiny_model, one_thread):
    return Session.load(LoadRequest(str(tiny_model), device="cpu"))


@pytest.fixture(scope="module")
def reference(tiny_model, one_thread):
    """A second session, emptied before every use: the from-scratch computation."""
    return Session.load(LoadRequest(str(tiny_model), device="cpu"))


def answer(session, reference, messages, new_tokens=6, lookup=False):
    """Generate on `session` as it stands, check it against `reference` from an empty cache
    with the same prompt ids, and return (reply text, the Finished stats)."""
    req = GenerateRequest(messages=tuple(messages), system=SYSTEM, max_new_tokens=new_tokens,
                          sampling=GREEDY, prompt_lookup=lookup)
    ids, reply, stats = answer_against_recompute(session, reference, req)
    assert stats.prompt_tokens == len(ids)
    return reply, stats


OPS = st.one_of(
    st.tuples(st.just("send"), st.sampled_from(WORDS)),
    st.tuples(st.just("regenerate")),
    st.tuples(st.just("edit"), st.integers(0, 10), st.sampled_from(WORDS)),
    st.tuples(st.just("crop"), st.integers(0, 400)),
)


@settings(deadline=None, max_examples=8, derandomize=True)
@given(ops=st.lists(OPS, min_size=2, max_size=5), lookup=st.booleans())
def test_reuse_equals_recompute_over_edits_and_regenerates(session, reference, ops, lookup):
    session.cache.crop(0)
    messages = [{"role": "user", "content": "What does zipfile do?"}]
    messages.append({"role": "assistant",
                     "content": answer(session, reference, messages, lookup=lookup)[0]})
    for op in ops:
        if op[0] == "crop":  # an earlier cache cut short (another chat, an eviction)
            session.cache.crop(op[1] % (len(session.cache.token_ids) + 1))
            continue
        if op[0] == "send":
            messages.append({"role": "user", "content": f"And {op[1]}?"})
        elif op[0] == "regenerate":
            messages.pop()  # the last answer; its question is answered again
        else:
            users = [i for i, m in enumerate(messages) if m["role"] == "user"]
            i = users[op[1] % len(users)]
            messages[i:] = [{"role": "user", "content": f"What about {op[2]}?"}]
        reply, _ = answer(session, reference, messages, lookup=lookup)
        messages.append({"role": "assistant", "content": reply})


def test_next_turn_computes_only_what_is_new(session, reference):
    session.cache.clear()
    messages = [{"role": "user", "content": "What does zipfile do?"}]
    reply, first = answer(session, reference, messages)
    assert first.cached_prompt_tokens == 0
    # the prompt and the answer but its last token (never fed) stay cached by hash, in full
    # blocks; the rest of the last block is computed again with what is new
    block = session.cache.block_size
    held = (first.prompt_tokens + first.new_tokens - 1) // block * block
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And?"}]
    _, second = answer(session, reference, messages)
    assert second.cached_prompt_tokens == held > 0
    # computed: the last block's rest, the template's closing and opening, "And?"
    tail = "<|im_end|>\n<|im_start|>user\nAnd?<|im_end|>\n<|im_start|>assistant\n"
    num_tail = len(session.lm.tokenizer(tail, add_special_tokens=False)["input_ids"])
    assert num_tail < second.computed_prompt_tokens <= num_tail + block + 1
    messages.pop()  # regenerate: the prompt of the first turn's full blocks are all cached
    _, again = answer(session, reference, messages[:1])
    assert again.computed_prompt_tokens == (first.prompt_tokens - 1) % block + 1


def test_a_chat_outgrowing_the_context_drops_its_oldest_turns(tiny_model, one_thread):
    context = 96
    s = Session.load(LoadRequest(str(tiny_model), device="cpu", context=context))
    system_ids = s.prompt_ids(GenerateRequest(messages=({"role": "user", "content": "x"},),
                                              system=SYSTEM))
    system_ids = system_ids[:system_ids.index(1, 1)]  # up to the second <|im_start|>
    messages, dropped_any = [], False
    for i in range(10):
        messages.append({"role": "user", "content": f"Question {i}: what does module {i} do?"})
        req = GenerateRequest(messages=tuple(messages), system=SYSTEM, max_new_tokens=12,
                              sampling=GREEDY)
        ids = s.prompt_ids(req)
        events = list(s.generate(req))
        stats = finished(events).stats
        assert stats.context_used_tokens <= context
        assert ids[:len(system_ids)] == system_ids  # the system prompt always stays
        if stats.dropped_messages:
            dropped_any = True
            # the system prompt's K/V survive the drop: only the kept turns are prefilled again
            assert stats.cached_prompt_tokens >= len(system_ids)
        messages.append({"role": "assistant", "content": text(events)})
    assert dropped_any


@pytest.mark.parametrize("draft", ["qwen2", "llama"])  # itself: all accepted; another: few
def test_reuse_with_a_draft_model_equals_recompute(draft, tiny_models, reference, one_thread):
    s = Session.load(LoadRequest(str(tiny_models["qwen2"]), device="cpu",
                                 draft=str(tiny_models[draft]), num_speculative_tokens=3))
    s.adaptive = s.switch_off = False  # speculate every step: reproducible
    messages = [{"role": "user", "content": "What does zipfile do?"}]
    for step in ("send", "send", "regenerate", "edit", "send"):
        if step == "send" and len(messages) > 1:
            messages.append({"role": "user", "content": f"And {WORDS[len(messages) % 6]}?"})
        elif step == "regenerate":
            messages.pop()
        elif step == "edit":
            messages[2:] = [{"role": "user", "content": "What about csv?"}]
        reply, stats = answer(s, reference, messages, new_tokens=10)
        assert stats.speculation == "draft" and stats.proposed_draft_tokens > 0
        messages.append({"role": "assistant", "content": reply})


@pytest.mark.parametrize("folder, kv", [("qwen2_bf16", "auto"), ("qwen2", "int8"),
                                        ("qwen2", "fp8"), ("qwen2", "auto")])
def test_logits_after_a_reused_prefix_agree_within_rounding(folder, kv, tiny_models,
                                                            tiny_model_bf16, one_thread):
    """A bf16 model or a quantized KV cache: the next token's logits with two thirds of the
    prompt reused agree with a from-scratch pass within the compute dtype's rounding
    (assert_close's defaults for that dtype)."""
    path = tiny_model_bf16 if folder == "qwen2_bf16" else tiny_models[folder]
    s = Session.load(LoadRequest(str(path), device="cpu", kv_dtype=kv))
    messages = ({"role": "user", "content": "What does zipfile do? It reads archives."},
                {"role": "assistant", "content": "It reads and writes zip files, mostly."},
                {"role": "user", "content": "And tarfile, in the same spirit?"})
    ids = torch.tensor(s.prompt_ids(GenerateRequest(messages=messages, system=SYSTEM)))
    reused = len(ids) * 2 // 3
    s.cache.crop(0)
    s.decoder.forward(ids[:reused], 0)
    warm = s.decoder.forward(ids[reused:], reused).clone()
    s.cache.crop(0)
    cold = s.decoder.forward(ids, 0).clone()
    torch.testing.assert_close(warm, cold)
    assert warm.argmax() == cold.argmax()
