"""The fused draft: SGLang's EAGLE ``draft_forward`` as a fixed chain of Triton kernels.

Per draft step ``i < S - 1`` over ``R = bs * k`` rows (one per frontier node):

1. ``draft_input``: embedding and hidden-state gathers (+ EAGLE-3's two input RMSNorms);
   EAGLE-1: ``fc`` with bias (``linear``);
2. ``linear``: the q/k/v projection;
3. ``draft_attention``: RoPE, the row's k/v into a private chain, attention over the request's paged prefix
   KV (SGLang's draft KV pool, through ``req_to_token``) plus the row's own chain;
4. ``linear``: o-proj + residual (also keeps the fp32 sum the post-attention norm reads);
5. ``linear``: post-attention RMSNorm prologue, gate/up projection, SiLU-and-mul epilogue;
6. ``linear``: down-proj + residual = the carried hidden state;
7. ``lm_head_topk``: (EAGLE-3 final norm,) LM head, softmax and top-k without materialising logits;
8. ``draft_select``: the next frontier (SGLang's ``select_top_k_tokens``) and the tree bookkeeping.

``draft_select`` runs once more for the last step, then ``draft_organize`` prunes the tree to ``n - 1``
nodes (SGLang's ``organize_draft_results``). Grids depend only on ``bs`` and the model's shapes; all
temporaries are allocated per call, so under SGLang's draft CUDA graph they live in the graph's pool.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from sgl_eagle_triton.kernels.draft_attention import draft_attention
from sgl_eagle_triton.kernels.draft_input import draft_input
from sgl_eagle_triton.kernels.draft_organize import draft_organize
from sgl_eagle_triton.kernels.draft_select import draft_select
from sgl_eagle_triton.kernels.embed_shard import embed_shard
from sgl_eagle_triton.kernels.linear import epilogue, linear
from sgl_eagle_triton.kernels.lm_head_topk import lm_head_topk, lm_head_topk_shard, merge_shards


@dataclass
class DraftWeights:
    """A one-layer Llama EAGLE draft's tensors (in the model's dtype, bf16 or fp16, unless noted), bound by
    reference to the model's.

    embed: [V, H] (target vocabulary); qkv: [(Hq + 2 Hkv) D, 2H] (EAGLE-3) or [(Hq + 2 Hkv) D, H];
    o_proj: [H, Hq D]; post_norm: [H]; gate_up: [2I, H]; down: [H, I]; lm_head: [Vd, H];
    rotary: SGLang's rotary-embedding module (neox style over the whole head; its ``cos_sin_cache``
    [max_pos, D] fp32 is read at every call because SGLang may grow it). EAGLE-3 only: input_norm,
    hidden_norm, final_norm [H]. EAGLE-1 only: fc [H, 2H], fc_bias [H]. Optional: qkv_bias, o_bias;
    token_map [Vd] int64 (draft id -> target id).
    """

    eagle3: bool
    embed: torch.Tensor
    qkv: torch.Tensor
    o_proj: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    lm_head: torch.Tensor
    rotary: torch.nn.Module
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    input_norm: torch.Tensor | None = None
    hidden_norm: torch.Tensor | None = None
    final_norm: torch.Tensor | None = None
    fc: torch.Tensor | None = None
    fc_bias: torch.Tensor | None = None
    qkv_bias: torch.Tensor | None = None
    o_bias: torch.Tensor | None = None
    token_map: torch.Tensor | None = None

    @property
    def hidden_size(self) -> int:
        return self.o_proj.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        """The model's dtype (bf16 or fp16): that of its activations, weights and KV cache."""
        return self.qkv.dtype


@dataclass
class TensorParallel:
    """The drafter's rank of SGLang's tensor-parallel group (the target's; SGLang has no separate draft TP size).

    ``all_reduce(t)``: the sum of ``t`` over the ranks (a new tensor, or ``t`` summed in place);
    ``all_gather(t)``: every rank's ``t`` stacked in rank order, ``[size, *t.shape]``; ``embed_shard`` /
    ``lm_head_shard``: ``(offset, valid)`` of this rank's rows of the embedding / LM head (:func:`vocab_shard`). The
    rank's :class:`DraftWeights` hold its shards as SGLang loads them: QKV and gate/up column-parallel (its heads,
    its intermediate columns), o-proj and down row-parallel, embedding and LM head vocabulary-parallel, norms (and
    EAGLE's ``fc``) whole."""

    size: int
    rank: int
    all_reduce: Callable[[torch.Tensor], torch.Tensor]
    all_gather: Callable[[torch.Tensor], torch.Tensor]
    embed_shard: tuple[int, int]
    lm_head_shard: tuple[int, int]


def vocab_shard(layer) -> tuple[int, int]:
    """``(offset, valid)`` of an SGLang ``VocabParallelEmbedding`` / ``ParallelLMHead`` on this tensor-parallel rank:
    its weight's rows are ids ``offset ..`` of the whole vocabulary, the first ``valid`` of them real, the rest
    padding (SGLang pads the vocabulary to a multiple of 64 and splits it evenly, so rank ``r``'s offset is ``r``
    times its row count: what ``kernels.lm_head_topk.merge_shards`` expects)."""
    shard = layer.shard_indices
    return shard.padded_org_vocab_start_index, shard.num_org_elements


def shard_layout(tp: TensorParallel, model, weights: DraftWeights) -> tuple:
    """What a rank tells the others at start (:func:`shard_layout_problems`): its embedding and LM-head ``(offset,
    valid)``, their row counts as SGLang holds them (padding included: the step between ranks' offsets), and its
    attention heads / KV heads."""
    return (tp.embed_shard, tp.lm_head_shard, model.model.embed_tokens.weight.shape[0], model.lm_head.weight.shape[0],
            weights.num_q_heads, weights.num_kv_heads)


def shard_layout_problems(layouts: list[tuple]) -> list[str]:
    """Every rank's :func:`shard_layout`, in rank order: what breaks the layout the TP drafter assumes (rank ``r``'s
    vocabulary rows start at ``r`` times the row count; every rank the same row counts and heads, so that each
    collective has the same shape everywhere), as readable lines; empty when sound."""
    problems = []
    for rank, (embed, head, embed_rows, head_rows, *heads) in enumerate(layouts):
        for name, (offset, _), rows in (("embedding", embed, embed_rows), ("LM head", head, head_rows)):
            if offset != rank * rows:
                problems.append(f"rank {rank}'s {name} rows start at id {offset}, not {rank} x {rows}")
        if (embed_rows, head_rows, *heads) != tuple(layouts[0][2:]):
            problems.append(f"rank {rank} holds {embed_rows} / {head_rows} vocabulary rows and {heads[0]} / "
                            f"{heads[1]} heads / KV heads, rank 0 {layouts[0][2]} / {layouts[0][3]} and "
                            f"{layouts[0][4]} / {layouts[0][5]}")
    return problems


TENSOR_FIELDS = ("embed", "qkv", "o_proj", "post_norm", "gate_up", "down", "lm_head", "input_norm", "hidden_norm",
                 "final_norm", "fc", "fc_bias", "qkv_bias", "o_bias")  # DraftWeights' weight tensors


def draft_weights(model, token_map: torch.Tensor | None) -> DraftWeights:
    """Binds a loaded SGLang ``LlamaForCausalLMEagle3`` / ``LlamaForCausalLMEagle`` (one layer, bf16 or fp16; the
    server-start checks in :mod:`sgl_eagle_triton.config` refuse other drafts) by reference (detached views of
    SGLang's tensors: the same storage, no autograd). Raises ValueError
    for a draft the fused drafter cannot run (its RoPE, or weights not all bf16 or all fp16)."""
    eagle3 = hasattr(model.model.layers[0], "hidden_norm")
    layer = model.model.layers[0]
    attn = layer.self_attn
    vocab = min(model.lm_head.weight.shape[0], model.logits_processor.vocab_size)
    w = DraftWeights(
        eagle3=eagle3,
        embed=model.model.embed_tokens.weight,
        qkv=attn.qkv_proj.weight,
        o_proj=attn.o_proj.weight,
        post_norm=layer.post_attention_layernorm.weight,
        gate_up=layer.mlp.gate_up_proj.weight,
        down=layer.mlp.down_proj.weight,
        lm_head=model.lm_head.weight[:vocab],
        rotary=attn.rotary_emb,
        num_q_heads=attn.num_heads,
        num_kv_heads=attn.num_kv_heads,
        head_dim=attn.head_dim,
        eps=layer.post_attention_layernorm.variance_epsilon,
        qkv_bias=attn.qkv_proj.bias,
        o_bias=attn.o_proj.bias,
        token_map=token_map,
    )
    rotary = attn.rotary_emb
    if not getattr(rotary, "is_neox_style", True) or getattr(rotary, "use_fallback_kernel", False):
        # The fallback path replaces the fp32 cos/sin table with a bf16 copy at its first call, freeing the
        # table a captured draft graph would read.
        raise ValueError("the fused drafter needs neox RoPE on SGLang's CUDA kernel path (head_dim 64/128/256/512)")
    if eagle3:
        w.input_norm, w.hidden_norm = layer.input_layernorm.weight, layer.hidden_norm.weight
        w.final_norm = model.model.norm.weight
    else:
        w.fc, w.fc_bias = model.model.fc.weight, model.model.fc.bias
    # Bound without autograd: SGLang builds EAGLE-1's fc as a torch.nn.Linear (parameters that require grad), and
    # the draft runs (and is captured) with grad mode on, where out= ops refuse such inputs.
    for name in TENSOR_FIELDS:
        if getattr(w, name) is not None:
            setattr(w, name, getattr(w, name).detach())
    tensors = tuple(getattr(w, name) for name in TENSOR_FIELDS)
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in tensors if t is not None})
    if dtypes not in (["bfloat16"], ["float16"]):
        raise ValueError(f"the fused drafter runs drafts whose weights are all bf16 or all fp16; this draft holds "
                         f"{' and '.join(dtypes)} weights")
    return w


def _node_in_layout(index: torch.Tensor, k: int, K: int) -> torch.Tensor:
    """Candidate indices of a topk-``k`` draft's score list (level 0: ``0..k-1``; level ``i >= 1``: ``k + (i-1) k^2
    + r k + c``, child ``c`` of frontier row ``r``) as the same nodes' indices in a topk-``K`` list."""
    deeper = index - k
    level, within = deeper.div(k * k, rounding_mode="floor"), deeper.remainder(k * k)
    row, child = within.div(k, rounding_mode="floor"), within.remainder(k)
    return torch.where(index < k, index, K + level * K * K + row * K + child)


def in_tree_layout(parent_list, top_scores_index, draft_tokens, all_scores, k: int, K: int, steps: int):
    """A topk-``k`` draft's ``(parent_list, top_scores_index, draft_tokens, all_scores)`` (shapes as
    :meth:`FusedDrafter.draft`) as a topk-``K`` draft of the same nodes: parent_list [bs, K (S-1) + 1] (level 0's
    ``-1, 0..K-1``; each later level's first k frontier entries the mapped ones, the rest repeating the first: no
    selected node refers to them), top_scores_index mapped (still ascending), the same draft tokens, and all_scores
    [bs, K + (S-1) K^2] with 0 for the candidates a topk-k draft does not have (None when ``all_scores`` is: only
    the draft check reads them). Only index arithmetic and copies (CUDA-graph safe). SGLang's build_tree at topk K
    then gives the tree build_tree at topk k gives."""
    bs = top_scores_index.shape[0]
    layout_parents = parent_list.new_empty(bs, K * (steps - 1) + 1 if steps > 1 else 0)
    if steps > 1:
        layout_parents[:, 0] = -1
        layout_parents[:, 1:K + 1] = torch.arange(K, device=parent_list.device)
        if steps > 2:
            mapped = _node_in_layout(parent_list[:, k + 1:].reshape(bs, steps - 2, k), k, K)
            blocks = layout_parents[:, K + 1:].view(bs, steps - 2, K)
            blocks[:, :, :k] = mapped
            blocks[:, :, k:] = mapped[:, :, :1]
    scores = None
    if all_scores is not None:
        scores = all_scores.new_zeros(bs, K + (steps - 1) * K * K)
        scores[:, _node_in_layout(torch.arange(all_scores.shape[1], device=all_scores.device), k, K)] = all_scores
    return layout_parents, _node_in_layout(top_scores_index, k, K), draft_tokens, scores


class _LayerRows:
    """Scratch of the draft layer over ``R`` rows (:meth:`FusedDrafter._layer`), the chains of ``chain_len`` steps
    in the pool's dtype ``kv_dtype``."""

    def __init__(self, w: DraftWeights, R: int, chain_len: int, kv_dtype: torch.dtype, device):
        H, D = w.hidden_size, w.head_dim

        def new(*shape, dtype=w.dtype):
            return torch.empty(*shape, dtype=dtype, device=device)

        self.x, self.residual, self.qkv = new(R, 2 * H), new(R, H), new(R, w.qkv.shape[0])
        self.attn, self.h1, self.s = new(R, w.num_q_heads * D), new(R, H), new(R, H)
        self.h1_sum, self.s_sum = new(R, H, dtype=torch.float32), new(R, H, dtype=torch.float32)
        self.act = new(R, w.gate_up.shape[0] // 2)
        self.chain_k = new(chain_len, R, w.num_kv_heads, D, dtype=kv_dtype)  # quantised as the pool
        self.chain_v = torch.empty_like(self.chain_k)


class FusedDrafter:
    """Runs the whole draft of one decode cycle for a batch; see the module docstring.

    k_cache / v_cache: the draft layer's KV-pool buffers [slots, Hkv, D] in the weights' dtype (bf16 or fp16) or
    an FP8 format (``--kv-cache-dtype fp8_e4m3 / fp8_e5m2``), whose scales are ``k_scale`` / ``v_scale`` (the
    draft attention layer's, 1 without); req_to_token: [reqs, ctx] int32 (SGLang's request-to-slot table).
    """

    def __init__(self, weights: DraftWeights, topk: int, num_steps: int, num_draft_tokens: int,
                 k_cache: torch.Tensor, v_cache: torch.Tensor, req_to_token: torch.Tensor,
                 k_scale: float = 1.0, v_scale: float = 1.0, tp: TensorParallel | None = None,
                 layout_topk: int | None = None, keep_scores: bool = True):
        self.w = weights
        self.tp = tp
        self.topk = topk
        self.layout_topk = layout_topk or topk  # the server's topk (see draft)
        self.keep_scores = keep_scores
        if self.layout_topk < topk:
            raise ValueError(f"layout topk {self.layout_topk} below the drafter's topk {topk}")
        self.num_steps = num_steps
        self.num_draft_tokens = num_draft_tokens
        self.k_cache = k_cache
        self.v_cache = v_cache
        self.req_to_token = req_to_token
        self.kv_scales = k_scale, v_scale

    def draft(self, topk_p, topk_index, hidden, positions, seq_lens, req_pool_indices):
        """``(parent_list [bs, k(S-1)+1], top_scores_index [bs, n-1], draft_tokens [bs, n-1])``, all int64,
        and ``all_scores`` [bs, k + (S-1) k^2] fp32 (every candidate's score, as SGLang's ``score_list``).

        topk_p: [bs, k] fp32 and topk_index: [bs, k] int64 (the draft extend's top-k, draft vocabulary when
        the weights have a token map); hidden: [bs, H] in the weights' dtype (the carried hidden state);
        positions: [bs * k] int64 (advanced by ``S - 1`` in place, as SGLang's draft forward does); seq_lens:
        [bs] int64; req_pool_indices: [bs] int64.

        With a layout topk K above k (an adaptive state narrower than the server's topk): the inputs are the
        server's, [bs, K] (sorted: their first k columns are the top k) and positions [bs * K]; the draft runs
        over k rows per request, and the tree comes back in K's layout (:func:`in_tree_layout`), the tree a
        topk-K drafter would organise had its other candidates scored 0; all_scores only with ``keep_scores``
        (the draft check's; set at construction).
        """
        K, k = self.layout_topk, self.topk
        if K == k:
            return self._draft(topk_p, topk_index, hidden, positions, seq_lens, req_pool_indices)
        bs = topk_p.shape[0]
        own = positions.view(bs, K)[:, :k].clone().view(bs * k)  # a copy; a request's rows share one position
        *tree, scores = self._draft(topk_p[:, :k].contiguous(), topk_index[:, :k].contiguous(), hidden, own,
                                    seq_lens, req_pool_indices)
        if self.num_steps > 1:
            positions.add_(self.num_steps - 1)
        return in_tree_layout(*tree, scores if self.keep_scores else None, k, K, self.num_steps)

    def _draft(self, topk_p, topk_index, hidden, positions, seq_lens, req_pool_indices):
        w, k, S = self.w, self.topk, self.num_steps
        bs = topk_p.shape[0]
        if bs == 0:  # an idle batch
            empty = topk_index.new_empty
            return (empty(0, k * (S - 1) + 1 if S > 1 else 0), empty(0, self.num_draft_tokens - 1),
                    empty(0, self.num_draft_tokens - 1), topk_p.new_empty(0, k + (S - 1) * k * k))
        R = bs * k
        dev = topk_p.device
        T = k + (S - 1) * k * k

        def new(*shape, dtype=w.dtype):
            return torch.empty(*shape, dtype=dtype, device=dev)

        scores = new(bs, k, dtype=torch.float32)
        input_ids, hidden_rows, step_positions = (new(R, dtype=torch.int64) for _ in range(3))
        all_scores, all_tokens = new(bs, T, dtype=torch.float32), new(bs, T, dtype=torch.int64)
        parent_list = new(bs, k * (S - 1) + 1 if S > 1 else 0, dtype=torch.int64)
        tree = (scores, input_ids, hidden_rows, all_scores, all_tokens, parent_list, positions, step_positions)
        draft_select(0, S, topk_p, topk_index, *tree, token_map=w.token_map)

        if S > 1:
            rows = _LayerRows(w, R, S - 1, self.k_cache.dtype, dev)
            p = new(R, k, dtype=torch.float32)
            index = new(R, k, dtype=torch.int64)
        for step in range(S - 1):
            s, s_sum = self._layer(rows, input_ids, hidden, hidden_rows, step_positions, req_pool_indices, seq_lens,
                                   step, k)
            self._lm_head(s_sum if w.eagle3 else s, p, index)
            hidden = s
            draft_select(step + 1, S, p, index, *tree)

        top_scores_index = new(bs, self.num_draft_tokens - 1, dtype=torch.int64)
        draft_tokens = torch.empty_like(top_scores_index)
        draft_organize(all_scores, all_tokens, top_scores_index, draft_tokens)
        return parent_list, top_scores_index, draft_tokens, all_scores

    def _layer(self, rows: _LayerRows, input_ids, hidden, hidden_rows, positions, req_pool_indices, seq_lens,
               step: int, k: int):
        """The draft layer over ``rows``' R rows (``k`` per request, at ``positions``; attention over each request's
        first ``seq_lens`` pool positions, then its chain entries ``0 .. step``): ``(s, s_sum)``, the carried hidden
        state [R, H] and its fp32 sum (the final norm's input)."""
        w, D = self.w, self.w.head_dim
        attn_in = self._layer_input(input_ids, hidden, hidden_rows, rows.x, rows.residual)
        linear(attn_in, w.qkv, rows.qkv, bias=w.qkv_bias)
        draft_attention(rows.qkv, positions, w.rotary.cos_sin_cache, self.k_cache, self.v_cache, self.req_to_token,
                        req_pool_indices, seq_lens, rows.chain_k, rows.chain_v, step, k, w.num_q_heads,
                        w.num_kv_heads, D, D**-0.5, rows.attn, *self.kv_scales)
        self._row_parallel(rows.attn, w.o_proj, rows.h1, rows.residual, rows.h1_sum, bias=w.o_bias)
        linear(rows.h1_sum, w.gate_up, rows.act, norm_weight=w.post_norm, eps=w.eps, silu_mul=True)
        self._row_parallel(rows.act, w.down, rows.s, rows.h1, rows.s_sum)
        return rows.s, rows.s_sum

    def draft_extend(self, input_ids, hidden, seq_lens, accept_lens, req_pool_indices, store_kv: Callable, topk: int):
        """SGLang's draft extend after a chain's verify, less what nobody reads: the K / V of every row (``store_kv(k,
        v)`` [bs n, Hkv, D] stores them in the pool at the verify's slots, row ``b n + j`` request ``b``'s position
        ``seq_lens[b] + j``), then the layer, LM head and top-k of each request's last accepted row alone
        (:meth:`extend_step`; SGLang runs the whole layer and LM head over all ``n`` rows and keeps that one).

        input_ids: [bs, n] int64 (the verify's next tokens); hidden: [bs, n, H] the carried hidden states (EAGLE-3:
        ``fc`` of the target's features); seq_lens: [bs] int64 (before the verify); accept_lens: [bs] (accepted
        drafts + 1, any integer dtype); req_pool_indices: [bs] int64; bs >= 1. Returns :meth:`extend_step`'s."""
        bs, n = input_ids.shape
        ids, carried = input_ids.reshape(-1), hidden.reshape(bs * n, hidden.shape[-1])
        positions = (seq_lens[:, None] + torch.arange(n, device=seq_lens.device)).reshape(-1)
        store_kv(*self.draft_kv(ids, carried, positions))
        selected = torch.arange(bs, device=ids.device) * n + accept_lens.to(torch.int64) - 1
        return self.extend_step(ids[selected], carried[selected], positions[selected], req_pool_indices, topk)

    def extend_step(self, input_ids, hidden, positions, req_pool_indices, topk: int):
        """The draft extend's output for one row per request (the row SGLang's ``_draft_extend_for_decode`` selects:
        the last accepted token's): ``(topk_p [bs, topk] fp32, topk_index [bs, topk] int64, hidden [bs, H])`` in
        the draft vocabulary (no token map: the next draft maps them), ``topk_p`` all ones at ``topk`` 1 (SGLang's
        argmax path); ``hidden`` the carried hidden state (pre-norm, as the draft's captured ``hidden_states``).

        input_ids: [bs] int64 (target vocabulary); hidden: [bs, H] the carried hidden state the layer starts from
        (EAGLE-3: ``fc`` of the target's features); positions: [bs] int64, the row's position, below which the
        request's KV is in the pool (the extend's earlier rows included: written first, :meth:`draft_kv`);
        req_pool_indices: [bs] int64."""
        w = self.w
        bs = input_ids.shape[0]
        rows = _LayerRows(w, bs, 1, self.k_cache.dtype, input_ids.device)
        s, s_sum = self._layer(rows, input_ids, hidden, torch.arange(bs, device=input_ids.device), positions,
                               req_pool_indices, positions, 0, 1)
        norm = dict(norm_weight=w.final_norm, eps=w.eps) if w.eagle3 else {}
        p, index = lm_head_topk(s_sum if w.eagle3 else s, w.lm_head, topk, **norm)
        return (torch.ones_like(p) if topk == 1 else p), index, s

    def _layer_input(self, input_ids, hidden, hidden_rows, x, residual):
        """The draft layer's input rows (EAGLE-3: ``x = [norm(embed); hidden_norm(hidden)]``, ``residual`` = the
        gathered hidden; EAGLE-1: ``fc([embed; hidden])``, also written to ``residual``)."""
        w = self.w
        embed = w.embed
        if self.tp is not None:  # this rank's vocabulary rows, summed over the ranks: the whole embedding's rows
            embed = self._embed_rows(input_ids)
            input_ids = torch.arange(input_ids.shape[0], device=input_ids.device)
        if w.eagle3:
            draft_input(input_ids, embed, hidden, hidden_rows, x, residual=residual, input_norm=w.input_norm,
                        hidden_norm=w.hidden_norm, eps=w.eps)
            return x
        draft_input(input_ids, embed, hidden, hidden_rows, x)
        return linear(x, w.fc, residual, bias=w.fc_bias)

    def _embed_rows(self, input_ids):
        """Under tensor parallelism: ``[R, H]`` embedding rows of ``input_ids``, each from the rank holding it
        (masked lookups all-reduced: exact, one rank's row plus zeros)."""
        offset, valid = self.tp.embed_shard
        embed = self.w.embed
        rows = embed_shard(input_ids, embed, offset, valid,
                           torch.empty(input_ids.shape[0], embed.shape[1], dtype=embed.dtype, device=embed.device))
        return self.tp.all_reduce(rows)

    def _row_parallel(self, x, weight, out, residual, out_sum, bias=None):
        """``out = rnd(x @ weight.T (+ bias) + residual)``, ``out_sum`` its fp32 sum (linear's residual epilogue).
        Under tensor parallelism ``weight`` holds this rank's input columns: each rank's rounded product (the bias
        on rank 0, as SGLang's RowParallelLinear) is all-reduced, then added to the residual
        (:func:`sgl_eagle_triton.kernels.linear.epilogue`)."""
        if self.tp is None:
            return linear(x, weight, out, bias=bias, residual=residual, out_sum=out_sum)
        linear(x, weight, out, bias=bias if self.tp.rank == 0 else None)
        # one kernel: the fp32 sum with the residual widened exactly, then rounded (3 torch launches before)
        return epilogue(self.tp.all_reduce(out), out, residual=residual, out_sum=out_sum)

    def _lm_head(self, head_in, out_p, out_index):
        """The draft LM head's top-k of each row into ``out_p`` / ``out_index``. Under tensor parallelism each rank
        reduces its vocabulary shard to ``k`` candidates and a sum, the ranks gather those (``k * 8 + 4`` bytes per
        row and rank), and every rank merges them into the single-GPU result (``kernels.lm_head_topk``)."""
        w, k = self.w, self.topk
        norm = dict(norm_weight=w.final_norm, eps=w.eps) if w.eagle3 else {}
        if self.tp is None:
            return lm_head_topk(head_in, w.lm_head, k, token_map=w.token_map, out_p=out_p, out_index=out_index,
                                **norm)
        offset, valid = self.tp.lm_head_shard
        keys, sums = lm_head_topk_shard(head_in, w.lm_head, k, vocab_offset=offset, valid=valid, **norm)
        return merge_shards(self.tp.all_gather(keys), self.tp.all_gather(sums), w.lm_head.shape[0], k,
                            token_map=w.token_map, out_p=out_p, out_index=out_index)

    def draft_kv(self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor):
        """The draft layer's K (RoPE applied) and V [bs, Hkv, D], in the weights' dtype, for tokens ``input_ids``
        [bs] int64 at ``positions`` [bs] int64 with carried hidden states ``hidden`` [bs, H] (EAGLE-3: the
        draft's ``fc`` of the target's features; EAGLE-1: the target's hidden state): what a draft extend of one
        token per request stores in the draft KV cache, without its attention, MLP and LM head (steps 0,
        :meth:`sgl_eagle_triton.worker.TritonEagleDraftWorker.fill_draft_kv`)."""
        w = self.w
        bs, H, D = input_ids.shape[0], w.hidden_size, w.head_dim
        x = torch.empty(bs, 2 * H, dtype=w.dtype, device=hidden.device)
        rows = torch.arange(bs, device=hidden.device)
        attn_in = self._layer_input(input_ids, hidden, rows, x, torch.empty_like(hidden))
        q_size, kv_size = w.num_q_heads * D, w.num_kv_heads * D  # the K and V rows of the projection only
        kv = linear(attn_in, w.qkv[q_size:], torch.empty(bs, 2 * kv_size, dtype=w.dtype, device=hidden.device),
                    bias=None if w.qkv_bias is None else w.qkv_bias[q_size:])
        k = kv[:, :kv_size].view(bs, w.num_kv_heads, D)
        v = kv[:, kv_size:].reshape(bs, w.num_kv_heads, D)
        cos, sin = w.rotary.cos_sin_cache[positions][:, None].chunk(2, dim=-1)  # neox RoPE, fp32 math
        k1, k2 = k.float().chunk(2, dim=-1)
        return torch.cat((k1 * cos - k2 * sin, k2 * cos + k1 * sin), dim=-1).to(w.dtype), v
