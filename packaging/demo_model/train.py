"""The demo models' recipe, in one run: the target, a draft distilled from it, the same draft
trained on the text alone (for comparison, not shipped), then the held-out figures.

    cd packaging/demo_model && python3 train.py --out OUT --minutes 6

Writes OUT/demo_models.tar (demo_model/, demo_draft/, text_draft/ as bf16 model folders) and
OUT/figures.json. Each model trains until its validation loss stops improving (the learning rate
is halved at each plateau) or its share of the time budget runs out; the best weights are kept.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import shutil
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository: engine.tools.eval's windows

import corpus  # noqa: E402
import data  # noqa: E402
import measure  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

TOKENIZER_DIR = HERE / "tokenizer"
SHAPES = {  # Qwen2: GQA (8 query heads over 2 KV heads, head_dim 32), tied embeddings
    "target": dict(hidden_size=256, intermediate_size=640, num_hidden_layers=6,
                   num_attention_heads=8, num_key_value_heads=2),
    # one layer: a draft's cost per proposed token follows its depth
    "draft": dict(hidden_size=128, intermediate_size=512, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2),
}
CONTEXT = 1024
EOS, ENDOFTEXT = 2, 0  # <|im_end|>, <|endoftext|> (build_tokenizer.py)
SHARE = {"target": 0.5, "distilled": 0.25, "text": 0.25}  # of --minutes
KL_WEIGHT = 0.9  # distillation loss: 0.9 KL(teacher || student) + 0.1 cross-entropy
QUESTIONS = ("What does `copy.copy` do?", "What does `json.dump` do?",
             "What does `re.finditer` do?", "What is `threading.Event`?",
             "What does `tarfile.is_tarfile` do?", "What is the `weakref` module for?")


def model_config(kind: str):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=4096, max_position_embeddings=CONTEXT,
                       tie_word_embeddings=True, use_sliding_window=False, sliding_window=None,
                       bos_token_id=None, eos_token_id=[EOS, ENDOFTEXT], pad_token_id=ENDOFTEXT,
                       **SHAPES[kind])


def build(kind: str, device, seed: int, dropout: float):
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM._from_config(model_config(kind), attn_implementation="sdpa")
    model.to(device)
    if dropout:
        # residual dropout on each block's two outputs: the corpus is small for 4M weights
        for layer in model.model.layers:
            for sub in (layer.self_attn.o_proj, layer.mlp):
                sub.register_forward_hook(
                    lambda m, args, out: F.dropout(out, dropout, m.training))
    return model


def params(model) -> dict:
    total = sum(p.numel() for p in model.parameters())
    emb = model.model.embed_tokens.weight.numel()
    return {"parameters": total, "non_embedding_parameters": total - emb}


class Trainer:
    """AdamW, warm-up, then halve the learning rate at each validation plateau; keep the best."""

    def __init__(self, model, loss_fn, valid, lr: float, budget_s: float, device, autocast,
                 eval_every: int, patience: int = 3, max_halvings: int = 4, warmup: int = 100):
        self.model, self.loss_fn, self.valid = model, loss_fn, valid
        decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
        rest = [p for n, p in model.named_parameters() if p.dim() < 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                      {"params": rest, "weight_decay": 0.0}],
                                     lr=lr, betas=(0.9, 0.95), fused=device.type == "cuda")
        self.lr, self.budget_s, self.autocast = lr, budget_s, autocast
        self.eval_every, self.patience, self.max_halvings, self.warmup = (
            eval_every, patience, max_halvings, warmup)

    @torch.no_grad()
    def validate(self) -> float:
        self.model.eval()
        total = 0.0
        for lo in range(0, self.valid.shape[0], 8):
            with self.autocast():
                total += float(self.loss_fn(self.model, self.valid[lo:lo + 8])) * min(
                    8, self.valid.shape[0] - lo)
        self.model.train()
        return total / self.valid.shape[0]

    def run(self, stream, name: str) -> dict:
        t0 = time.perf_counter()
        best, best_state, bad, halvings, step, lr = math.inf, None, 0, 0, 0, self.lr
        history = []
        self.model.train()
        for batch in stream:
            step += 1
            for g in self.opt.param_groups:
                g["lr"] = lr * min(1.0, step / self.warmup)
            with self.autocast():
                loss = self.loss_fn(self.model, batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            out_of_time = time.perf_counter() - t0 > self.budget_s
            if step % self.eval_every and not out_of_time:
                continue
            v = self.validate()
            history.append((step, round(loss.item(), 4), round(v, 4), lr))
            print(f"[{name}] step {step} epoch {stream.epoch} train {loss.item():.4f} "
                  f"valid {v:.4f} lr {lr:.2e} {time.perf_counter() - t0:.0f}s", flush=True)
            if v < best - 1e-4:
                best, bad = v, 0
                best_state = copy.deepcopy(self.model.state_dict())
            else:
                bad += 1
                if bad >= self.patience:
                    halvings, bad, lr = halvings + 1, 0, lr / 2
            if out_of_time or halvings > self.max_halvings:
                break
        self.model.load_state_dict(best_state)
        self.model.eval()
        return {"steps": step, "epochs": round(step * stream.batch * stream.seq
                                               / stream.tokens_per_epoch, 2),
                "tokens_seen": step * stream.batch * stream.seq, "best_valid_loss": best,
                "stopped": "time" if out_of_time else "plateau",
                "seconds": round(time.perf_counter() - t0, 1), "history": history}


def ce_loss(model, batch):
    logits = model(input_ids=batch[:, :-1]).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())


def distill_loss(teacher):
    def loss_fn(model, batch):
        x, y = batch[:, :-1], batch[:, 1:].flatten()
        with torch.no_grad():
            t = F.log_softmax(teacher(input_ids=x).logits.flatten(0, 1).float(), -1)
        s = F.log_softmax(model(input_ids=x).logits.flatten(0, 1).float(), -1)
        kl = F.kl_div(s, t, log_target=True, reduction="batchmean")  # KL(teacher || student)
        return KL_WEIGHT * kl + (1 - KL_WEIGHT) * F.nll_loss(s, y)
    return loss_fn


def save(model, folder: Path) -> int:
    """A bf16 model folder the engine loads (model_folder.check); returns the weights' bytes."""
    from transformers import GenerationConfig

    model = copy.deepcopy(model).to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    model.generation_config = GenerationConfig(
        bos_token_id=None, eos_token_id=[EOS, ENDOFTEXT], pad_token_id=ENDOFTEXT,
        do_sample=True, temperature=0.7, top_p=0.9)
    model.save_pretrained(folder, safe_serialization=True)
    for f in TOKENIZER_DIR.iterdir():
        shutil.copy2(f, folder / f.name)
    return (folder / "model.safetensors").stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--minutes", type=float, default=6.0, help="training time, all three models")
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("--batch", type=int, help="rows per step (default 32 on a GPU, 2 on CPU)")
    ap.add_argument("--seq", type=int, help="training row length (default 1024, 128 on CPU)")
    ap.add_argument("--variants", type=int, default=4, help="shapings of the training split")
    ap.add_argument("--max-eval-tokens", type=int, help="cut the held-out text (smoke tests)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")
    batch, seq = args.batch or (32 if cuda else 2), args.seq or (CONTEXT if cuda else 128)
    eval_every = 50 if cuda else 5

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)

    import transformers
    from transformers import AutoTokenizer

    transformers.utils.logging.disable_progress_bar()
    t_start = time.perf_counter()
    tokens = data.Tokens(TOKENIZER_DIR)
    stream = data.Stream(tokens, "train", args.variants, seq, batch, device, args.seed)
    valid = data.fixed_rows(tokens, "valid", seq, device, max_rows=None if cuda else 8)
    print(f"device {device} ({torch.cuda.get_device_name() if cuda else platform.processor()}); "
          f"{stream.tokens_per_epoch} training tokens per epoch, {valid.numel()} validation; "
          f"prepared in {time.perf_counter() - t_start:.1f}s", flush=True)
    budget = {k: v * args.minutes * 60 for k, v in SHARE.items()}
    report: dict = {"device": torch.cuda.get_device_name() if cuda else "cpu",
                    "torch": torch.__version__, "python": platform.python_version(),
                    "args": {k: str(v) for k, v in vars(args).items()}, "batch": batch,
                    "seq": seq, "tokens_per_epoch": stream.tokens_per_epoch,
                    "transformers": transformers.__version__, "models": {}}

    runs = {}
    target = build("target", device, args.seed, dropout=0.1)
    runs["target"] = Trainer(target, ce_loss, valid, 1.5e-3, budget["target"], device, autocast,
                             eval_every).run(stream, "target")
    target.requires_grad_(False)
    drafts = {}
    for name, loss_fn in (("distilled", distill_loss(target)), ("text", ce_loss)):
        stream.epoch = 0  # each draft sees the same batches in the same order
        drafts[name] = build("draft", device, args.seed + 1, dropout=0.0)
        runs[name] = Trainer(drafts[name], loss_fn, valid, 3e-3, budget[name], device, autocast,
                             eval_every).run(stream, name)

    # the folders first: if a figure fails below, the trained weights still come back
    args.out.mkdir(parents=True, exist_ok=True)
    stage = args.out / "models"
    folders = {"target": "demo_model", "distilled": "demo_draft", "text": "text_draft"}
    models = {"target": target, **drafts}
    sizes = {name: save(model, stage / folders[name]) for name, model in models.items()}
    with tarfile.open(args.out / "demo_models.tar", "w") as tar:
        tar.add(stage, arcname=".")

    heldout = corpus.HELDOUT_TEXT.read_text(encoding="utf-8")
    tok = AutoTokenizer.from_pretrained(stage / "demo_model")
    ids = tok(heldout, verbose=False)["input_ids"]
    ids = ids[:args.max_eval_tokens] if args.max_eval_tokens else ids
    figures = measure.heldout_figures(target, drafts, ids, CONTEXT, CONTEXT // 2, device)
    for name, model in models.items():
        report["models"][name] = {
            "folder": folders[name], **params(model), "safetensors_bytes": sizes[name],
            "shape": SHAPES["target" if name == "target" else "draft"],
            "training": runs[name], "heldout": figures[name]}
    report["answers"] = {q: measure.answer(target, tok, q, device) for q in QUESTIONS}
    shutil.rmtree(stage)
    report["total_seconds"] = round(time.perf_counter() - t_start, 1)
    (args.out / "figures.json").write_text(json.dumps(report, indent=1) + "\n")

    print("\nmodel       params   held-out ppl  top-1 agree  E[accept]  steps  stop")
    for name, m in report["models"].items():
        h = m["heldout"]
        print(f"{name:10} {m['parameters']:8d} {h['perplexity']:12.3f} "
              f"{h.get('top1_agreement', float('nan')):11.4f} "
              f"{h.get('expected_acceptance_t1', float('nan')):10.4f} "
              f"{m['training']['steps']:6d}  {m['training']['stopped']}")
    for q, a in report["answers"].items():
        print(f"\nQ: {q}\nA: {a}")
    print(f"\ntotal {report['total_seconds']}s; held-out tokens {figures['target']['tokens']}")


if __name__ == "__main__":
    main()
