"""Shape docstring records into training documents: plain text and short chats.

Pure standard library and deterministic: a record's documents depend only on the record and the
seed (each record draws from its own `random.Random`), never on the order or the Python version.
Some chats ask to repeat or lightly edit a passage, so the answer copies long n-grams of the
prompt: that is what prompt-lookup speculative decoding finds.
"""

from __future__ import annotations

import random
import re

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # trained first, so their ids are 0, 1, 2

# The fixtures' template (tests/fixtures/tiny.py): messages rendered as given, no default system.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SYSTEM = "You are a helpful assistant who knows the Python standard library."

TASK_PROBABILITY = 0.45  # a repeat/edit chat for this share of records
SYSTEM_PROBABILITY = 0.15
TWO_TURN_PROBABILITY = 0.15
MIN_PASSAGE, MAX_PASSAGE = 80, 700

ASK_SUMMARY = {
    "function": ("What does `{name}` do?", "What is `{name}` for?",
                 "Briefly, what does `{name}()` do?", "Explain `{name}` in a sentence or two."),
    "method": ("What does the `{name}` method do?", "What is `{name}` for?",
               "Briefly explain `{name}()`."),
    "class": ("What is `{name}`?", "What is the `{name}` class for?",
              "Describe the class `{name}` briefly."),
    "module": ("What is the `{name}` module for?", "What does the `{name}` module provide?",
               "Give me a one-paragraph overview of `{name}`."),
    "topic": ("What does the Python reference say about `{name}`?",
              "Explain the `{name}` topic from the Python language reference.",
              "Summarize the language reference section on `{name}`."),
}
ASK_FULL = ("Show me the documentation of `{name}`.", "How do I use `{name}`?",
            "Explain `{name}` in detail.", "Print the docstring of `{name}`.")
ASK_SIGNATURE = ("What are the parameters of `{name}`?", "What is the signature of `{name}`?",
                 "How do I call `{name}`?")
ASK_REPEAT = ("Repeat the following passage exactly:\n\n{p}",
              "Copy this text back to me, unchanged:\n\n{p}",
              "Say this again, word for word:\n\n{p}")
REPLACEMENTS = ("value", "object", "item", "element", "entry", "result", "widget", "record",
                "token", "name")


def render(messages: list[dict]) -> str:
    """What CHAT_TEMPLATE renders for these messages (no generation prompt)."""
    return "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)


def join(documents: list[str]) -> str:
    """One text: each document followed by <|endoftext|>, as the training stream packs them."""
    return "".join(d + ENDOFTEXT for d in documents)


def paragraphs(doc: str) -> list[str]:
    return [p.strip() for p in re.split(r"\n\s*\n", doc) if p.strip()]


def summary(doc: str) -> str:
    paras = paragraphs(doc)
    head = paras[0]
    if len(head) < 30 and len(paras) > 1:  # a bare signature line: the sense is in the next one
        head = head + "\n\n" + paras[1]
    return head


def _sentences(p: str) -> list[str]:
    flat = " ".join(p.split())
    return [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`])", flat) if s]


def _passage(doc: str, rng: random.Random) -> str | None:
    fits = [p for p in paragraphs(doc) if MIN_PASSAGE <= len(p) <= MAX_PASSAGE]
    return rng.choice(fits) if fits else None


def _swap_letters(word: str, rng: random.Random) -> str:
    i = rng.randrange(1, len(word) - 2)
    return word[:i] + word[i + 1] + word[i] + word[i + 2:]


def _task(p: str, rng: random.Random) -> tuple[str, str]:
    """(prompt, answer) for a repeat or light-edit task on passage p."""
    words = sorted({w for w in re.findall(r"\b[a-z]{4,}\b", p)})
    kind = rng.choice(("repeat", "repeat", "replace", "typos", "bullets", "first", "plain"))
    if kind == "replace" and words:
        w = rng.choice(words)
        r = rng.choice([x for x in REPLACEMENTS if x != w])
        return (f'Replace every "{w}" with "{r}" in this passage:\n\n{p}',
                re.sub(rf"\b{w}\b", r, p))
    if kind == "typos" and words:
        targets = {w for w in rng.sample(words, min(2, len(words))) if len(w) >= 5}
        if targets:
            bad = re.sub(r"\b[a-z]{5,}\b",
                         lambda m: _swap_letters(m[0], rng) if m[0] in targets else m[0], p)
            return f"Fix the typos in this passage:\n\n{bad}", p
    sentences = _sentences(p)
    if kind == "bullets" and len(sentences) > 1:
        return (f"Turn this passage into a bulleted list, one sentence per line:\n\n{p}",
                "\n".join(f"- {s}" for s in sentences))
    if kind == "first" and len(sentences) > 1:
        return f"Quote the first sentence of this passage:\n\n{p}", sentences[0]
    if kind == "plain" and "``" in p:
        return f"Remove the double backquotes from this passage:\n\n{p}", p.replace("``", "")
    return rng.choice(ASK_REPEAT).format(p=p), p


def _plain(rec: dict, rng: random.Random) -> str:
    name, kind, sig, doc = rec["name"], rec["kind"], rec["signature"], rec["doc"]
    if kind in ("function", "method") and sig and rng.random() < 0.5:
        body = "\n".join(("    " + line).rstrip() for line in doc.splitlines())
        return f'def {name.rsplit(".", 1)[-1]}{sig}:\n    """\n{body}\n    """\n'
    if kind == "topic":
        return doc
    head = {"module": f"Module {name}", "class": f"class {name}"}.get(kind, f"{name}{sig}")
    return f"{head}\n\n{doc}"


def _question(rec: dict, rng: random.Random) -> tuple[str, str]:
    name, kind, sig, doc = rec["name"], rec["kind"], rec["signature"], rec["doc"]
    roll = rng.random()
    if kind in ("function", "method") and sig not in ("", "()") and roll < 0.15:
        return rng.choice(ASK_SIGNATURE).format(name=name), f"`{name}{sig}`"
    if kind != "topic" and roll < 0.4 and len(doc) <= 2500:
        head = f"`{name}{sig}`\n\n" if sig else ""
        return rng.choice(ASK_FULL).format(name=name), head + doc
    answer = summary(doc)
    if kind == "topic":  # reference sections are long: answer with their opening paragraphs
        answer = "\n\n".join(paragraphs(doc)[:3])[:1200]
    return rng.choice(ASK_SUMMARY[kind]).format(name=name), answer


def _chat(prompt: str, answer: str, rng: random.Random) -> list[dict]:
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
    if rng.random() < SYSTEM_PROBABILITY:
        messages.insert(0, {"role": "system", "content": SYSTEM})
    return messages


def record_documents(rec: dict, seed: int) -> tuple[str, list[list[dict]]]:
    """(plain text, chats) for one record."""
    rng = random.Random(f"{seed}:{rec['kind']}:{rec['name']}")
    chats = [_chat(*_question(rec, rng), rng)]
    if rng.random() < TASK_PROBABILITY:
        p = _passage(rec["doc"], rng)
        if p is not None:
            chats.append(_chat(*_task(p, rng), rng))
    return _plain(rec, rng), chats


def documents(records: list[dict], seed: int) -> list[str]:
    """Every record's plain text and rendered chats; a few chats become two-turn conversations."""
    docs: list[str] = []
    pending: list[dict] | None = None  # a chat waiting for a second turn
    rng = random.Random(f"{seed}:two-turn")
    for rec in records:
        plain, chats = record_documents(rec, seed)
        docs.append(plain)
        for chat in chats:
            if pending is not None:
                second = [m for m in chat if m["role"] != "system"]
                docs.append(render(pending + second))
                pending = None
            elif rng.random() < TWO_TURN_PROBABILITY:
                pending = chat
            else:
                docs.append(render(chat))
    if pending is not None:
        docs.append(render(pending))
    return docs
