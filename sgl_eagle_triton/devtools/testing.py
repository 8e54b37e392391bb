"""Random inputs for tests and benchmarks (never imported by the plugin): one-layer Llama EAGLE drafts as
:class:`~sgl_eagle_triton.drafter.DraftWeights` (EAGLE-3: input norms, draft vocabulary with a token map;
EAGLE-1: fc with bias, q/k/v bias), the batch state a draft starts from, and draft trees shaped exactly as
SGLang's drafter shapes them."""

from types import SimpleNamespace

import torch

from sgl_eagle_triton.devtools.reference.draft_select import organize, select_step
from sgl_eagle_triton.drafter import DraftWeights

CODE_PROMPTS = (  # the trained tiny pair (devtools/assets/tiny-code-v1) writes Python: e2e tests and benchmarks
    "import os\n", "def fibonacci(n):\n", "class Stack:\n", "import numpy as np\n\ndef normalize(x):\n",
    "def read_json(path):\n", "for i in range(10):\n", "def quicksort(arr):\n", "import sys\n\ndef main():\n",
    "def is_prime(n):\n", "class Node:\n    def __init__(self, value):\n", "with open('data.txt') as f:\n",
    "def binary_search(items, target):\n", "import re\n\npattern = ", "def merge(a, b):\n",
    "if __name__ == '__main__':\n", "def factorial(n):\n    if n == 0:\n",
)


def cos_sin_cache(max_pos: int, head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    """SGLang's neox RoPE table: [max_pos, D] fp32, cos then sin."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)
    freqs = torch.arange(max_pos, dtype=torch.float)[:, None] * inv_freq
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


def random_draft(eagle3: bool, device, *, H=64, Hq=4, Hkv=2, D=16, inter=96, vocab=300, draft_vocab=120, seed=0,
                 dtype=torch.bfloat16):
    """``(weights, generator)``: weights in ``dtype`` (bf16 or fp16; the RoPE table and token map as SGLang's:
    fp32 and int64); the generator continues the seeded stream for further test inputs. The random draws do
    not depend on ``dtype``: the same seed gives the same draft rounded to either dtype."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(device)

    def norm():
        return (1 + 0.1 * torch.randn(H, generator=gen)).to(dtype).to(device)

    h_in = 2 * H if eagle3 else H
    qkv_rows = (Hq + 2 * Hkv) * D
    w = DraftWeights(
        eagle3=eagle3,
        embed=rand(vocab, H),
        qkv=rand(qkv_rows, h_in, scale=h_in**-0.5),
        o_proj=rand(H, Hq * D, scale=(Hq * D) ** -0.5),
        post_norm=norm(),
        gate_up=rand(2 * inter, H, scale=H**-0.5),
        down=rand(H, inter, scale=inter**-0.5),
        lm_head=rand(draft_vocab if eagle3 else vocab, H, scale=3 * H**-0.5),
        rotary=SimpleNamespace(cos_sin_cache=cos_sin_cache(4096, D).to(device)),
        num_q_heads=Hq,
        num_kv_heads=Hkv,
        head_dim=D,
        eps=1e-5,
    )
    if eagle3:
        w.input_norm, w.hidden_norm, w.final_norm = norm(), norm(), norm()
        w.token_map = torch.randperm(vocab, generator=gen)[:draft_vocab].to(device)
    else:
        w.fc, w.fc_bias = rand(H, 2 * H, scale=(2 * H) ** -0.5), rand(H, scale=0.1)
        w.qkv_bias = rand(qkv_rows, scale=0.1)
    return w, gen


def draft_shard(w: DraftWeights, rank: int, size: int) -> tuple[DraftWeights, tuple, tuple, slice]:
    """Rank ``rank`` of ``size``'s draft weights as SGLang shards them (column-parallel QKV and gate/up, row-parallel
    o_proj and down, vocabulary-parallel embedding and LM head), its embedding / LM-head ``(offset, valid)`` and its
    KV heads (a slice of the whole draft's)."""
    D, Hq, Hkv = w.head_dim, w.num_q_heads, w.num_kv_heads
    hq, inter = Hq // size, w.down.shape[1] // size
    # KV heads split over the ranks, or (fewer heads than ranks) replicated: rank r holds head r // (size // Hkv)
    hkv, kv_index = (Hkv // size, rank) if Hkv >= size else (1, rank // (size // Hkv))
    q, k, v = w.qkv.split([Hq * D, Hkv * D, Hkv * D])

    def part(t, n, index=rank):  # rows of this rank
        return t[index * n:(index + 1) * n]

    qkv = torch.cat([part(q, hq * D), part(k, hkv * D, kv_index), part(v, hkv * D, kv_index)]).contiguous()
    gate, up = w.gate_up.chunk(2)
    vocab, draft_vocab = w.embed.shape[0] // size, w.lm_head.shape[0] // size
    local = DraftWeights(
        eagle3=w.eagle3, embed=part(w.embed, vocab).contiguous(), qkv=qkv,
        o_proj=w.o_proj[:, rank * hq * D:(rank + 1) * hq * D].contiguous(), post_norm=w.post_norm,
        gate_up=torch.cat([part(gate, inter), part(up, inter)]).contiguous(),
        down=w.down[:, rank * inter:(rank + 1) * inter].contiguous(), lm_head=part(w.lm_head, draft_vocab).contiguous(),
        rotary=w.rotary, num_q_heads=hq, num_kv_heads=hkv, head_dim=D, eps=w.eps, input_norm=w.input_norm,
        hidden_norm=w.hidden_norm, final_norm=w.final_norm, fc=w.fc, fc_bias=w.fc_bias, token_map=w.token_map,
        o_bias=w.o_bias,
        qkv_bias=None if w.qkv_bias is None else torch.cat([part(b, n * D, i) for b, n, i in zip(
            w.qkv_bias.split([Hq * D, Hkv * D, Hkv * D]), (hq, hkv, hkv), (rank, kv_index, kv_index), strict=True)]))
    heads = slice(kv_index * hkv, (kv_index + 1) * hkv)
    return local, (rank * vocab, vocab), (rank * draft_vocab, draft_vocab), heads


def random_batch(w: DraftWeights, bs: int, topk: int, steps: int, seq_lens: list[int], gen: torch.Generator, device,
                 kv_dtype: torch.dtype | None = None, kv_scales: tuple[float, float] = (1.0, 1.0), page_size: int = 1):
    """A batch state for a draft (the inputs SGLang hands ``draft_forward``), as a dict.

    ``k_cache`` / ``v_cache`` [slots, Hkv, D] in the draft's dtype, or ``kv_dtype`` (an FP8 pool: random values
    over their scale, quantised; ``k_scale`` / ``v_scale`` = ``kv_scales``): a pool of ``page_size``-slot pages
    whose first page is SGLang's padding; every request owns scattered whole pages (``req_to_token``
    [bs + 1, ctx] int32, slots consecutive within a page); ``req_pool_indices`` [bs], ``seq_lens`` [bs] (the
    prefix lengths given), ``positions`` [bs * topk]; the draft extend's ``topk_p`` [bs, topk] (descending) and
    ``topk_index`` (distinct draft-vocabulary ids per request), ``hidden`` [bs, H] in the draft's dtype.
    """
    Hkv, D = w.num_kv_heads, w.head_dim
    pages_per_row = -(-(max(seq_lens) + topk * steps + 4) // page_size)
    ctx = pages_per_row * page_size
    slots = (1 + (bs + 1) * pages_per_row) * page_size
    k_cache, v_cache = (torch.randn(slots, Hkv, D, generator=gen).to(w.dtype) for _ in range(2))
    if kv_dtype is not None:
        k_cache, v_cache = ((c / s).to(w.dtype).to(kv_dtype) for c, s in zip((k_cache, v_cache), kv_scales,
                                                                                strict=True))
    pages = (torch.randperm(slots // page_size - 1, generator=gen) + 1).view(bs + 1, pages_per_row, 1)
    req_to_token = (pages * page_size + torch.arange(page_size)).view(bs + 1, ctx).int().to(device)
    k_cache, v_cache = k_cache.to(device), v_cache.to(device)
    req_pool_indices = (torch.randperm(bs, generator=gen) + 1).to(device)
    seq_lens_t = torch.tensor(seq_lens, device=device)
    topk_p = torch.rand(bs, topk, generator=gen).sort(dim=-1, descending=True).values.to(device)
    vocab = w.lm_head.shape[0]
    topk_index = torch.stack([torch.randperm(vocab, generator=gen)[:topk] for _ in range(bs)]).to(device)
    hidden = torch.randn(bs, w.hidden_size, generator=gen).to(w.dtype).to(device)
    return dict(k_cache=k_cache, v_cache=v_cache, req_to_token=req_to_token, req_pool_indices=req_pool_indices,
                seq_lens=seq_lens_t, positions=seq_lens_t.repeat_interleave(topk), topk_p=topk_p,
                topk_index=topk_index, hidden=hidden, k_scale=kv_scales[0], v_scale=kv_scales[1])


def draft_tree(bs: int, topk: int, steps: int, n: int, gen: torch.Generator):
    """``(parent_list, selected_index)`` as SGLang's EAGLE draft makes them.

    Runs the selection twins (``select_top_k_tokens`` per draft step, ``organize_draft_results``) on random
    draft probabilities. Scores are cumulative products of probabilities in (0, 1) in float64, so they are
    tie-free and a child always scores below its parent: every selected node's parent is selected too
    (asserted).
    """

    def probs(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float64) * 0.9 + 0.05

    scores, score_list, token_list, parents_list = None, [], [], []
    for step in range(steps):
        p = probs(bs, topk) if step == 0 else probs(bs, topk, topk).view(bs * topk, topk)
        _, _, scores, cand_scores, cand_tokens, parents = select_step(step, p, torch.zeros_like(p, dtype=torch.long),
                                                                      scores, topk)
        score_list.append(cand_scores)
        token_list.append(cand_tokens)
        parents_list.append(parents)
    parent_list, selected_index, _ = organize(score_list, token_list, parents_list, n)
    assert parent_list.shape[1] in (0, topk * (steps - 1) + 1)
    for parents, selected in zip(parent_list.tolist(), selected_index.tolist(), strict=True):
        assert all(s // topk == 0 or parents[s // topk] in selected for s in selected)
    return parent_list, selected_index


def random_tree_mask(n: int, gen: torch.Generator) -> torch.Tensor:
    """[n, n] bool: row ``i`` marks draft token ``i``'s ancestors and itself in a random tree of ``n`` nodes (node 0
    the root, node ``i``'s parent drawn from ``0 .. i - 1``), the tree part of SGLang's target-verify mask."""
    tree = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        tree[i] |= tree[int(torch.randint(0, i, (1,), generator=gen))]
    return tree
