"""Prefix sharing across conversations over the paged cache (kv_cache.KVCache.reuse): a new chat
whose system prompt an earlier one had reuses its blocks without copying them and prefills only
the rest; greedy output with any reuse equals a from-scratch computation token for token (fp32),
over switches between conversations, edits and regenerates, with a draft model and with prompt
lookup, and under a small arena whose cached blocks are evicted; an int8 cache agrees within
rounding; the live chat wastes under 5% of the KV bytes it holds."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.events import GenerateRequest, LoadRequest, SamplingParams
from engine.generate.session import Session
from tests.engine.helpers import answer_against_recompute, finished, text

GREEDY = SamplingParams(temperature=0.0)
SYSTEMS = ("You are a careful assistant who answers questions about the Python standard "
           "library in a few plain words.",
           "You are a terse assistant; answer in one line.")
WORDS = ("zipfile", "tarfile", "json", "csv", "heapq", "bisect")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def reference(tiny_model, one_thread):
    """Emptied before every use: the from-scratch computation."""
    return Session.load(LoadRequest(str(tiny_model), device="cpu"))


def answer(session, reference, messages, system, new_tokens=6, **kw):
    """Generate on `session` as it stands; check the tokens against `reference` from an empty
    cache and the cached/computed split against the cache's state -> (reply, stats)."""
    req = GenerateRequest(messages=tuple(messages), system=system, max_new_tokens=new_tokens,
                          sampling=GREEDY, **kw)
    _, reply, stats = answer_against_recompute(session, reference, req)
    check_blocks(session.cache)
    return reply, stats


def check_blocks(cache) -> None:
    """The block manager's invariants around the live sequence."""
    bm, seq = cache.blocks, cache.seq
    assert len(set(seq.block_ids)) == len(seq.block_ids)
    assert len(cache.token_ids) <= seq.num_tokens <= len(seq.block_ids) * cache.block_size
    for b in seq.block_ids:
        assert bm.blocks[b].ref_count == 1 and b not in bm.evictable and b not in bm.free_ids
    table = cache.table.tolist()
    assert table[:len(seq.block_ids)] == seq.block_ids  # what the decode step reads
    assert set(table[len(seq.block_ids):]) <= {cache.scratch}


def test_a_new_chat_with_a_seen_system_prompt_shares_its_blocks(tiny_model, reference):
    s = Session.load(LoadRequest(str(tiny_model), device="cpu"))
    a = [{"role": "user", "content": "What does zipfile do?"}]
    reply, first = answer(s, reference, a, SYSTEMS[0])
    assert first.cached_prompt_tokens == 0
    a += [{"role": "assistant", "content": reply}]
    system_ids = s.prompt_ids(GenerateRequest(messages=({"role": "user", "content": "x"},),
                                              system=SYSTEMS[0]))
    system_ids = system_ids[:system_ids.index(1, 1)]  # up to the second <|im_start|>
    num_shared = len(system_ids) // s.cache.block_size
    assert num_shared >= 2, len(system_ids)
    blocks_a = list(s.cache.seq.block_ids)
    # another system prompt: shares only the template's first tokens with the live chat
    _, other = answer(s, reference, [{"role": "user", "content": "And csv?"}], SYSTEMS[1])
    assert other.cached_prompt_tokens < s.cache.block_size
    # a new chat with the first system prompt: its full blocks come back by hash, not copied
    b = [{"role": "user", "content": "And csv?"}]
    _, second = answer(s, reference, b, SYSTEMS[0])
    assert second.cached_prompt_tokens >= num_shared * s.cache.block_size
    assert second.cached_prompt_tokens % s.cache.block_size == 0
    assert s.cache.seq.block_ids[:num_shared] == blocks_a[:num_shared]
    # back to the first chat: its history is cached up to its last full block, in its blocks
    a += [{"role": "user", "content": "And tarfile?"}]
    _, third = answer(s, reference, a, SYSTEMS[0])
    assert third.cached_prompt_tokens > second.cached_prompt_tokens
    n = third.cached_prompt_tokens // s.cache.block_size
    assert s.cache.seq.block_ids[:n] == blocks_a[:n]


ACTIONS = st.one_of(
    st.tuples(st.just("send"), st.sampled_from(WORDS)),
    st.tuples(st.just("regenerate")),
    st.tuples(st.just("edit"), st.integers(0, 10), st.sampled_from(WORDS)),
)


@settings(deadline=None, max_examples=8, derandomize=True)
@given(ops=st.lists(st.tuples(st.integers(0, 2), ACTIONS), min_size=3, max_size=7),
       lookup=st.booleans())
def test_switching_conversations_equals_recompute(tiny_model, reference, ops, lookup):
    """Three conversations (the first and the last share a system prompt), each op on one of
    them, in an arena of 8 blocks, about one conversation: the cached blocks of the others are
    found by hash or evicted as they are written over, and every answer still equals the
    from-scratch one."""
    s = Session.load(LoadRequest(str(tiny_model), device="cpu", context=128))
    chats = [(SYSTEMS[i % 2], [{"role": "user", "content": f"What does {WORDS[i]} do?"}])
             for i in range(3)]
    for chat, op in ops:
        system, messages = chats[chat]
        if messages[-1]["role"] == "assistant":
            if op[0] == "send":
                messages.append({"role": "user", "content": f"And {op[1]}?"})
            elif op[0] == "regenerate":
                messages.pop()
        if op[0] == "edit":
            users = [i for i, m in enumerate(messages) if m["role"] == "user"]
            i = users[op[1] % len(users)]
            messages[i:] = [{"role": "user", "content": f"What about {op[2]}?"}]
        if len(s.prompt_ids(GenerateRequest(messages=tuple(messages), system=system))) > 100:
            messages[:] = [{"role": "user", "content": "Start again."}]  # stay in context
        reply, _ = answer(s, reference, messages, system, prompt_lookup=lookup)
        messages.append({"role": "assistant", "content": reply})


def test_eviction_under_a_small_arena_never_corrupts_the_live_chat(tiny_model, reference):
    """An arena of 8 blocks: each new conversation takes free blocks, then the least recently
    used cached ones; the live chat's blocks are never taken, and every answer equals recompute."""
    s = Session.load(LoadRequest(str(tiny_model), device="cpu", context=128))
    bm = s.cache.blocks
    assert bm.num_available == 8
    evicted = []
    new_block = bm._new_block

    def counting():
        if not bm.free_ids:
            evicted.append(next(iter(bm.evictable)))
        return new_block()

    bm._new_block = counting
    for i, word in enumerate(WORDS * 2):
        messages = [{"role": "user", "content": f"What does {word} do?"}]
        reply, _ = answer(s, reference, messages, SYSTEMS[i % 2], new_tokens=10)
        messages += [{"role": "assistant", "content": reply},
                     {"role": "user", "content": "Why?"}]
        answer(s, reference, messages, SYSTEMS[i % 2], new_tokens=10)
    assert len(evicted) >= 4


@pytest.mark.parametrize("draft", ["qwen2", "llama"])  # itself: all accepted; another: few
def test_shared_prefixes_with_a_draft_model_equal_recompute(draft, tiny_models, reference):
    s = Session.load(LoadRequest(str(tiny_models["qwen2"]), device="cpu",
                                 draft=str(tiny_models[draft]), num_speculative_tokens=3))
    s.adaptive = s.switch_off = False  # speculate every step: reproducible
    for word in ("zipfile", "csv", "zipfile"):
        messages = [{"role": "user", "content": f"What does {word} do?"}]
        reply, stats = answer(s, reference, messages, SYSTEMS[0], new_tokens=10)
        assert stats.speculation == "draft" and stats.proposed_draft_tokens > 0
        messages += [{"role": "assistant", "content": reply},
                     {"role": "user", "content": "And json?"}]
        answer(s, reference, messages, SYSTEMS[0], new_tokens=10)
    # the draft's own cache shared the system prompt's blocks too
    assert s.draft.cache.blocks.by_hash


def test_an_int8_cache_shares_prefixes_within_rounding(tiny_model):
    """A quantized cache: the next token's logits over a system prompt's blocks cached by an
    earlier conversation agree with a from-scratch pass within fp32 rounding (assert_close's
    defaults), the blocks' bytes having come from another prefill pass."""
    s = Session.load(LoadRequest(str(tiny_model), device="cpu", kv_dtype="int8"))
    list(s.generate(GenerateRequest(messages=({"role": "user", "content": "What is json?"},),
                                    system=SYSTEMS[0], max_new_tokens=4, sampling=GREEDY)))
    ids = s.prompt_ids(GenerateRequest(messages=({"role": "user", "content": "And csv?"},),
                                       system=SYSTEMS[0]))
    start = s.cache.reuse(ids)
    assert start >= 2 * s.cache.block_size
    warm = s.decoder.forward(torch.tensor(ids[start:]), start).clone()
    s.cache.clear()
    assert s.cache.reuse(ids) == 0
    cold = s.decoder.forward(torch.tensor(ids), 0).clone()
    torch.testing.assert_close(warm, cold)
    assert warm.argmax() == cold.argmax()


def test_a_long_chat_wastes_under_5_percent_of_its_kv_bytes(tiny_model):
    """Waste = (KV bytes of the blocks the live chat holds - bytes of the tokens it uses) /
    bytes held, from its sequence's blocks at the last step of every turn once the chat is
    past 20 blocks: at most a partly filled last block (and the block of the token the step
    writes). The old static cache held the whole context from the first token."""
    s = Session.load(LoadRequest(str(tiny_model), device="cpu", context=1024))
    messages, wastes = [], []
    for i in range(40):
        messages.append({"role": "user", "content": f"Tell me about {WORDS[i % 6]}, part {i}."})
        req = GenerateRequest(messages=tuple(messages), system=SYSTEMS[0], max_new_tokens=24,
                              sampling=GREEDY, ignore_eos=True)
        events, batch, blocks, used = [], s.own_batch(), 0, 0
        for event in s.generate(req):
            events.append(event)
            for seq in batch.scheduler.running:  # the turn's sequence while it has blocks
                blocks, used = len(seq.table.block_ids), seq.num_computed
        assert finished(events).stats.dropped_messages == 0
        messages.append({"role": "assistant", "content": text(events)})
        held = blocks * s.cache.block_size
        if blocks > 20:
            wastes.append((held - used) / held)
        if used > 700:
            break
    assert len(wastes) >= 5 and max(wastes) < 0.05, wastes
