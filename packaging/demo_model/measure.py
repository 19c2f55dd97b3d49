"""Training-time figures on held-out text: perplexity of each model, and how often each draft
agrees with the target, teacher-forced.

Same strided windows as `hearth eval` (engine/tools/eval.py `windows`), but on the in-memory
transformers models in fp32: the engine's figure on the bundled bf16 weights is measured apart.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from engine.tools.eval import windows


@torch.no_grad()
def heldout_figures(target, drafts: dict, ids: list[int], window: int, stride: int,
                    device: torch.device) -> dict:
    """{"target": {...}, <draft name>: {...}} with perplexity, and for drafts also
    top-1 agreement with the target and the expected acceptance of sampling at temperature 1
    (sum over tokens of min(p_target, p_draft), the rejection-sampling accept rate)."""
    models = {"target": target, **drafts}
    nll = dict.fromkeys(models, 0.0)
    agree = dict.fromkeys(drafts, 0)
    accept = dict.fromkeys(drafts, 0.0)
    count = 0
    tokens = torch.tensor(ids, dtype=torch.long, device=device)
    for begin, end, first in windows(len(ids), window, stride):
        x = tokens[None, begin:end]
        targets = tokens[first:end]
        keep = end - first + 1
        logp = {}
        for name, model in models.items():
            logits = model(input_ids=x, logits_to_keep=keep).logits[0, :-1].float()
            logp[name] = F.log_softmax(logits, dim=-1)  # [end - first, V]
            nll[name] += float(F.nll_loss(logp[name], targets, reduction="sum"))
        top = logp["target"].argmax(-1)
        p_target = logp["target"].exp()
        for name in drafts:
            agree[name] += int((logp[name].argmax(-1) == top).sum())
            accept[name] += float(torch.minimum(p_target, logp[name].exp()).sum())
        count += targets.numel()
    out = {name: {"perplexity": math.exp(nll[name] / count), "tokens": count} for name in models}
    for name in drafts:
        out[name]["top1_agreement"] = agree[name] / count
        out[name]["expected_acceptance_t1"] = accept[name] / count
    return out


@torch.no_grad()
def answer(model, tokenizer, question: str, device: torch.device, max_new_tokens: int = 96
           ) -> str:
    """Greedy answer through transformers' generate(), for the training log."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                           tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).to(device)
    out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
                         pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
