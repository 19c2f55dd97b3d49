"""AWQ's two searches over calibration activations (Lin et al. 2023; AutoAWQ's auto_scale and
auto_clip), as pure functions on tensors; tools/awq_quantize.py runs them layer by layer.

- Scale: the input channels that see large activations matter most, so multiply them up before
  rounding (W' = W diag(s), x' = x / s, folded into the op before): s = x_mean^a / w_mean^(1-a)
  over a grid of a, keeping the s whose rounded layer reproduces the full-precision outputs
  best. Unlike AutoAWQ, s = 1 (plain rounding) is a candidate too, so a search never does worse
  than round-to-nearest on its own objective.
- Clip: shrink each group's range (max |w| times 1, 0.95, ..., 0.55) where that lowers the
  group's output error: fewer outliers, finer steps for the rest.
The objective is the outputs of the linear layers that share an input (AutoAWQ measures the whole
attention block for q/k/v; the layers' own outputs cover every architecture alike).
"""

from __future__ import annotations

import torch

from engine.quant.awq_format import fake_quantize, fake_quantize_groups

SCALE_GRID = 20
CLIP_GRID, MAX_SHRINK = 20, 0.5
CLIP_TOKENS = 512
CLIP_BATCH_FLOATS = 1 << 24  # outputs [groups, tokens, rows] per batch of rows: 64 MB in fp32


def search_scale(x_mean: torch.Tensor, x: torch.Tensor, weights: list[torch.Tensor],
                 group_size: int) -> tuple[torch.Tensor, float]:
    """x_mean: [K] mean |x| per input channel over all calibration tokens; x: [T, K] a sample
    of them; weights: the [N_i, K] layers that read x -> (s [K], best ratio a; -1: s = 1)."""
    w = torch.cat([w.float() for w in weights])  # [N, K]
    N, K = w.shape
    w_abs = w.abs().view(-1, group_size)
    w_mean = (w_abs / (w_abs.amax(1, keepdim=True) + 1e-6)).view(N, K).mean(0)  # [K]
    x = x.float()
    ref = x @ w.t()  # [T, N]

    def loss(s: torch.Tensor) -> float:
        return float((x @ (fake_quantize(w * s, group_size) / s).t() - ref).pow(2).mean())

    best_s, best_ratio = torch.ones_like(x_mean, dtype=torch.float32), -1.0
    best = loss(best_s)
    for i in range(SCALE_GRID):
        ratio = i / SCALE_GRID
        s = (x_mean.float().pow(ratio) / (w_mean.pow(1 - ratio) + 1e-4)).clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()  # centred around 1: neither side overflows
        s[~torch.isfinite(s)] = 1
        err = loss(s)
        if err < best:
            best, best_s, best_ratio = err, s, ratio
    return best_s, best_ratio


def search_clip(x: torch.Tensor, w: torch.Tensor, group_size: int) -> torch.Tensor:
    """x: [T, K] inputs (already divided by the chosen scales), w: [N, K] (already multiplied)
    -> max_vals [N, K/G]: per group, the clip bound with the smallest output error."""
    N, K = w.shape
    groups = K // group_size
    step = max(1, x.shape[0] // CLIP_TOKENS)
    xg = x[::step][:CLIP_TOKENS].float().view(-1, groups, group_size).transpose(0, 1)  # [g, T, G]
    rows = max(1, CLIP_BATCH_FLOATS // (groups * xg.shape[1]))
    best_max = torch.empty(N, groups, dtype=torch.float32, device=w.device)
    for lo in range(0, N, rows):
        wg = w[lo:lo + rows].float().view(-1, groups, group_size)  # [n, g, G]
        ref = torch.bmm(xg, wg.permute(1, 2, 0))  # [g, T, n]: each group's share of the output
        org_max = wg.abs().amax(-1)  # [n, g]
        best, best_err = org_max.clone(), torch.full_like(org_max, float("inf"))
        for i in range(int(MAX_SHRINK * CLIP_GRID)):
            max_val = org_max * (1 - i / CLIP_GRID)
            q = fake_quantize_groups(wg, max_val)
            err = (torch.bmm(xg, q.permute(1, 2, 0)) - ref).pow(2).mean(1).t()  # [n, g]
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best = torch.where(better, max_val, best)
        best_max[lo:lo + rows] = best
    return best_max
