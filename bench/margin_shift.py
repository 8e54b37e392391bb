"""How far correct changes of bf16 kernel arithmetic move the tiny target's top-1/top-2 log-prob margin (CPU).

Why: ``tests/lossless.py`` accepts a speculative output that differs from the no-spec one if, at the first
difference, it took a token no-spec rates at most ``TIE_MARGIN`` below its top-1 (among its 8 best). That bound
must cover what legitimate kernel arithmetic (verify vs decode shapes, tiling, split-KV) does to the margin; this
measures it for the trained tiny pair's target (``sgl_eagle_triton/devtools/assets/tiny-code-v1/target``) on
``CODE_PROMPTS`` (tokeniser defaults: BOS prepended).

Path A: greedy decode, prompt prefill then one token per step with a bf16 KV cache, exact attention (fp32 softmax,
fp32 P@V). Each variant re-runs A's tokens teacher-forced in one full-sequence (prefill-shape) forward, so all
context K/V is recomputed in its arithmetic. Shared: bf16 linears with fp32 accumulation, fp32 RMSNorm times the
weight in fp32, neox RoPE in fp32, bf16 residual and KV, bf16 logits, fp32 log_softmax. Per position, with t1/t2
A's top-2: shift = (lpV[t1] - lpV[t2]) - (lpA[t1] - lpA[t2]); a strict flip is another token strictly above t1
under V; margin loss = A's margin minus t1's margin over V's best other token.

    python -m bench.margin_shift [--prompts N] [--new-tokens N] [--out bench/results/<date>-cpu-margin-shift.json]

CPU only (one thread), about a minute for 16 prompts x 128 tokens; writes the JSON and a markdown table (.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tokenizers import Tokenizer

from sgl_eagle_triton.devtools import TRAINED_PAIR
from sgl_eagle_triton.devtools.testing import CODE_PROMPTS

ROOT = Path(__file__).resolve().parent.parent
TARGET = TRAINED_PAIR / "target"
BF = torch.bfloat16
TOL = 1e-4  # margins are multiples of 1/16 (bf16 logits) up to fp32 rounding
BUCKETS = ((0, 0), (0.0625, 0.125), (0.1875, 0.25), (0.3125, 0.3125), (0.375, 0.5), (0.5625, math.inf))


@dataclass(frozen=True)
class Arith:
    attn: str = "exact"  # exact (per query) | exact_vec (all queries, masked) | online | exp2 | split2
    block: int = 64  # key tile of the online softmax (P rounded to bf16 before P@V, row sum from the fp32 P)
    half_k: bool = False  # every linear (lm_head too) as two half-K fp32 partial sums added in fp32


VARIANTS = {
    "A_prefill_vec": Arith("exact_vec"),  # A's arithmetic in prefill shapes
    "B_online64": Arith("online"),  # flash-style online softmax
    "C_split2_b32": Arith("split2", 32),  # split-KV: 2 halves, each normalised, merged by log-sum-exp in fp32
    "D1_exp2_b64": Arith("exp2"),  # B with exp2 and scale * log2(e) folded in fp32 (FA2/FA3)
    "E_linear_halfK": Arith(half_k=True),
    "E+B_halfK_online64": Arith("online", half_k=True),
}


class TinyTarget:
    """The tiny Llama target in plain torch, arithmetic chosen per call by :class:`Arith`."""

    def __init__(self, path: Path = TARGET):
        cfg = json.loads((path / "config.json").read_text())
        self.w, self.tok = load_file(path / "model.safetensors"), Tokenizer.from_file(str(path / "tokenizer.json"))
        self.layers, self.nq, self.nkv, self.d = (cfg[k] for k in ("num_hidden_layers", "num_attention_heads",
                                                                   "num_key_value_heads", "head_dim"))
        self.eps, self.scale = cfg["rms_norm_eps"], self.d ** -0.5
        inv_freq = 1.0 / cfg["rope_parameters"]["rope_theta"] ** (torch.arange(0, self.d, 2).float() / self.d)
        freqs = torch.arange(4096, dtype=torch.float)[:, None] * inv_freq
        self.cos, self.sin = freqs.cos(), freqs.sin()

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text).ids  # add_special_tokens: BOS prepended, as SGLang's /generate does

    def linear(self, x, name, ar):
        w, k = self.w[name], x.shape[-1] // 2
        if not ar.half_k:
            return (x.float() @ w.float().T).to(BF)
        return (x[..., :k].float() @ w[:, :k].float().T + x[..., k:].float() @ w[:, k:].float().T).to(BF)

    def rmsnorm(self, x, name):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.w[name].float()).to(BF)

    def rope(self, x, pos):  # x [T, heads, D] bf16, neox halves
        c, s = self.cos[pos][:, None, :], self.sin[pos][:, None, :]
        x1, x2 = x.float().split(self.d // 2, -1)
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1).to(BF)

    def online(self, qf, k, v, start, end, ar):
        """Online softmax of one query over keys [start, end): (unnormalised fp32 output, running max, row sum)."""
        m, den, acc = torch.full((qf.shape[0],), -math.inf), torch.zeros(qf.shape[0]), torch.zeros(qf.shape[0], self.d)
        sl = self.scale * math.log2(math.e)  # exp2: scale * log2(e) folded in fp32
        for b0 in range(start, end, ar.block):
            b1 = min(b0 + ar.block, end)
            s = torch.einsum("hd,nhd->hn", qf, k[b0:b1].float())
            if ar.attn == "exp2":  # max of the raw scores; exp2(s * sl - m * sl)
                m_new = torch.maximum(m, s.max(-1).values)
                p, alpha = torch.exp2(s * sl - (m_new * sl)[:, None]), torch.exp2((m - m_new) * sl)
            else:
                s = s * self.scale
                m_new = torch.maximum(m, s.max(-1).values)
                p, alpha = torch.exp(s - m_new[:, None]), torch.exp(m - m_new)
            alpha = torch.where(torch.isinf(m), torch.zeros_like(alpha), alpha)
            den = den * alpha + p.sum(-1)
            acc = acc * alpha[:, None] + torch.einsum("hn,nhd->hd", p.to(BF).float(), v[b0:b1].float())
            m = m_new
        return acc, m, den

    def attend_one(self, q, k, v, ar):  # one query [heads, D] over keys [n, heads, D]
        if ar.attn == "exact":
            s = torch.einsum("hd,nhd->hn", q.float(), k.float()) * self.scale
            return torch.einsum("hn,nhd->hd", torch.softmax(s, -1), v.float()).to(BF)
        n, half = k.shape[0], (k.shape[0] + 1) // 2
        ranges = ((0, half), (half, n)) if ar.attn == "split2" else ((0, n),)
        parts = [self.online(q.float(), k, v, a, b, ar) for a, b in ranges if b > a]
        outs = [acc / den[:, None] for acc, _, den in parts]
        if len(parts) == 1:
            return outs[0].to(BF)
        lse = torch.stack([m + den.log() for _, m, den in parts])
        w = torch.exp(lse - lse.max(0).values)
        return ((w[0][:, None] * outs[0] + w[1][:, None] * outs[1]) / (w[0] + w[1])[:, None]).to(BF)

    def forward(self, ids, ar, cache=None, last_only=False):
        """Log-probs after each of ``ids``, which continue ``cache`` ({layer: (k, v)}, bf16, extended in place)."""
        cache = {} if cache is None else cache
        start, T = (cache[0][0].shape[0] if cache else 0), len(ids)
        pos, h = torch.arange(start, start + T), self.w["model.embed_tokens.weight"][torch.tensor(ids)]
        for i in range(self.layers):
            p = f"model.layers.{i}."
            x = self.rmsnorm(h, p + "input_layernorm.weight")
            q, k, v = (self.linear(x, f"{p}self_attn.{n}_proj.weight", ar).view(T, -1, self.d) for n in "qkv")
            q, k = self.rope(q, pos), self.rope(k, pos)
            cache[i] = (torch.cat([cache[i][0], k]), torch.cat([cache[i][1], v])) if i in cache else (k, v)
            k, v = (t.repeat_interleave(self.nq // self.nkv, 1) for t in cache[i])
            if ar.attn == "exact_vec":
                s = torch.einsum("thd,nhd->htn", q.float(), k.float()) * self.scale
                s = s.masked_fill(torch.arange(k.shape[0])[None, :] > pos[:, None], -math.inf)
                o = torch.einsum("htn,nhd->thd", torch.softmax(s, -1), v.float()).to(BF)
            else:
                o = torch.stack([self.attend_one(q[t], k[: start + t + 1], v[: start + t + 1], ar) for t in range(T)])
            h = h + self.linear(o.reshape(T, -1), p + "self_attn.o_proj.weight", ar)  # bf16 residual adds
            x = self.rmsnorm(h, p + "post_attention_layernorm.weight")
            g, u = (self.linear(x, f"{p}mlp.{n}_proj.weight", ar).float() for n in ("gate", "up"))
            h = h + self.linear((F.silu(g) * u).to(BF), p + "mlp.down_proj.weight", ar)
        x = self.rmsnorm(h[-1:] if last_only else h, "model.norm.weight")
        return torch.log_softmax(self.linear(x, "lm_head.weight", ar).float(), -1)

    def greedy(self, prompt_ids, new_tokens):
        """Path A: the greedy tokens and the log-probs each was chosen from, [new_tokens, vocab]."""
        cache, out = {}, []
        lps = [self.forward(prompt_ids, Arith(), cache, last_only=True)[0]]
        while True:
            out.append(int(lps[-1].argmax()))
            if len(out) == new_tokens:
                return out, torch.stack(lps)
            lps.append(self.forward(out[-1:], Arith(), cache)[0])

    def teacher_forced(self, prompt_ids, out, ar):
        """Log-probs at A's output positions, the whole sequence recomputed in one forward of ``ar``."""
        return self.forward(prompt_ids + out[:-1], ar)[len(prompt_ids) - 1:]


def margins(lpA, lpV):
    """Per position: A's top-1 minus top-2 margin, its shift under V, and t1's margin over V's best other token."""
    t1 = lpA.argmax(-1, keepdim=True)
    t2 = lpA.scatter(1, t1, -math.inf).argmax(-1, keepdim=True)
    mA, mV = (lpA.gather(1, t1) - lpA.gather(1, t2))[:, 0].double(), (lpV.gather(1, t1) - lpV.gather(1, t2))[:, 0]
    return mA, mV.double() - mA, (lpV.gather(1, t1)[:, 0] - lpV.scatter(1, t1, -math.inf).max(-1).values).double()


def summarize(mA, per_variant):
    """``mA`` [positions] and ``per_variant`` {name: (shift, dV)} from :func:`margins` -> JSON-able summary."""
    variants, flips = {}, {n: dV < -TOL for n, (_, dV) in per_variant.items()}
    for n, (shift, dV) in per_variant.items():
        a, f = shift.abs().numpy(), flips[n]
        variants[n] = {"median_abs_shift": float(np.median(a)), "p99_abs_shift": float(np.percentile(a, 99)),
                       "p99.9_abs_shift": float(np.percentile(a, 99.9)), "max_abs_shift": float(a.max()),
                       "strict_flips": int(f.sum()), "ties": int(((dV.abs() <= TOL) & (mA > TOL)).sum()),
                       "max_a_margin_at_flip": float(mA[f].max()) if f.any() else None,
                       "max_margin_loss": max(0.0, float((mA - dV).max()))}
    hist = []
    for lo, hi in BUCKETS:
        inb = (mA >= lo - TOL) & (mA <= hi + TOL)
        hist.append({"a_margin": [lo, hi if hi < math.inf else None], "positions": int(inb.sum()),
                     "flips": {n: int((f & inb).sum()) for n, f in flips.items()}})
    return {"variants": variants, "flips_by_a_margin": hist}


def run(n_prompts=16, new_tokens=128, model=None):
    model, mAs, per = model or TinyTarget(), [], {n: [] for n in VARIANTS}
    for text in CODE_PROMPTS[:n_prompts]:
        ids = model.encode(text)
        out, lpA = model.greedy(ids, new_tokens)
        for n, ar in VARIANTS.items():
            mA, shift, dV = margins(lpA, model.teacher_forced(ids, out, ar))
            per[n].append((shift, dV))
        mAs.append(mA)
    head = {"model": TARGET.relative_to(TARGET.parents[4]).as_posix(), "prompts": n_prompts, "new_tokens": new_tokens,
            "positions": n_prompts * new_tokens, "date": datetime.date.today().isoformat(), "device": "cpu",
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "arith": {n: asdict(a) for n, a in VARIANTS.items()}}
    return head | summarize(torch.cat(mAs), {n: tuple(map(torch.cat, zip(*r, strict=True))) for n, r in per.items()})


def markdown(r):
    cols, f = list(r["variants"]), "{:.4f}".format
    lines = [f"# Top-1/top-2 margin shift under bf16 kernel-arithmetic changes ({r['date']}, CPU)", "",
             f"`python -m bench.margin_shift`: `{r['model']}`, the first {r['prompts']} `CODE_PROMPTS` (BOS prepended),"
             f" {r['new_tokens']} greedy tokens each ({r['positions']} positions), torch {r['torch']}. Shift and loss"
             " in log-prob units. Variants are teacher-forced on path A's greedy tokens (decode shapes, exact"
             " attention); definitions in `bench/margin_shift.py`. Flips are strict; ties: V ties t1 where A did not.",
             "",
             "| variant | median abs shift | p99 | p99.9 | max | strict flips | ties | max A margin at a flip "
             "| max margin loss |", "|---|---|---|---|---|---|---|---|---|"]
    for n, v in r["variants"].items():
        at = "-" if v["max_a_margin_at_flip"] is None else f(v["max_a_margin_at_flip"])
        lines.append(f"| {n} | " + " | ".join(f(v[k]) for k in ("median_abs_shift", "p99_abs_shift", "p99.9_abs_shift",
                     "max_abs_shift")) + f" | {v['strict_flips']} | {v['ties']} | {at} | {f(v['max_margin_loss'])} |")
    lines += ["", "Strict flips by path A's margin (positions of path A; each variant tests each of them once):", "",
              "| A margin | positions | " + " | ".join(cols) + " | all |", "|---" * (len(cols) + 3) + "|"]
    for b in r["flips_by_a_margin"]:
        lo, hi = b["a_margin"]
        lines.append(f"| {f'>= {lo}' if hi is None else lo if lo == hi else f'{lo} - {hi}'} | {b['positions']} | "
                     + " | ".join(str(b["flips"][n]) for n in cols) + f" | {sum(b['flips'].values())} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=len(CODE_PROMPTS))
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, default=ROOT / f"bench/results/{datetime.date.today()}-cpu-margin-shift.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # fastest at these shapes: threads only oversubscribe a busy CPU
    r = run(args.prompts, args.new_tokens)
    args.out.write_text(json.dumps(r, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(r))
    print(markdown(r), end="")


if __name__ == "__main__":
    main()
