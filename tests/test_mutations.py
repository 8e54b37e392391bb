"""Tests that can fail: for every kernel family, a deliberately broken launcher is swapped in where the family's
parity test finds it, and that test must fail (AssertionError). A broken variant that passes means the test
cannot see that kind of bug.

Each broken variant wraps the real launcher and corrupts one thing a plausible bug would: an output off by one
position, a reversed or rolled token order, a dropped input, a wrong row.
"""

import functools

import pytest
import torch

from sgl_eagle_triton.drafter import FusedDrafter
from tests import (
    test_build_tree,
    test_draft_attention,
    test_draft_extend,
    test_draft_select,
    test_drafter,
    test_embed_shard,
    test_linear,
    test_lm_head_topk,
    test_rms_norm,
    test_target_probs,
    test_tree_evidence,
    test_tree_sampling,
    test_verify_attention,
    test_verify_epilogue,
    test_verify_greedy,
)


def broken(launcher, corrupt):
    """``launcher`` followed by ``corrupt(args, kwargs, result)`` (which edits outputs in place)."""

    @functools.wraps(launcher)
    def run(*args, **kwargs):
        result = launcher(*args, **kwargs)
        corrupt(args, kwargs, result)
        return result

    return run


def _drafter_with(corrupt):
    original = FusedDrafter.draft

    def draft(self, *args):
        out = original(self, *args)
        corrupt(out)
        return out

    return draft


def _reverse_tokens_at_batch_1(out):
    if out[2].shape[0] == 1:
        out[2].copy_(out[2].flip(-1))


def _roll_tokens_of_request_3(out):
    if out[2].shape[0] == 8:
        out[2][3].copy_(out[2][3].roll(1))


def test_drafter_reversing_its_tokens_at_batch_1_fails(monkeypatch, device):
    monkeypatch.setattr(FusedDrafter, "draft", _drafter_with(_reverse_tokens_at_batch_1))
    with pytest.raises(AssertionError, match="draft_tokens"):
        test_drafter.test_fused_draft_matches_teacher_forced_twin(monkeypatch, device, True, 1, 4, 4, 10, [33])


def test_drafter_permuting_tokens_at_batch_8_fails(monkeypatch, device):
    monkeypatch.setattr(FusedDrafter, "draft", _drafter_with(_roll_tokens_of_request_3))
    case = (8, 2, 3, 6, [5, 9, 13, 20, 3, 7, 30, 11])
    with pytest.raises(AssertionError, match="draft_tokens"):
        test_drafter.test_fused_draft_matches_teacher_forced_twin(monkeypatch, device, False, *case)


def test_drafter_with_a_short_attention_prefix_fails(monkeypatch, device):
    """The draft attention misses each request's last prefix token: caught by the teacher-forced forwards."""
    from sgl_eagle_triton import drafter as drafter_module

    attention = drafter_module.draft_attention

    def short_prefix(qkv, positions, cos_sin, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, *rest):
        return attention(qkv, positions, cos_sin, k_cache, v_cache, req_to_token, req_pool_indices,
                         (seq_lens - 1).clamp_min(0), *rest)

    monkeypatch.setattr(drafter_module, "draft_attention", short_prefix)
    with pytest.raises(AssertionError):
        test_drafter.test_fused_draft_matches_teacher_forced_twin(monkeypatch, device, True, 2, 4, 3, 8, [1, 17])


def test_draft_kv_with_rope_one_position_late_fails(monkeypatch, device):
    """The steps-0 draft KV rotated for the next position (an off-by-one between the verified token and its
    successor): caught by the twin comparison."""
    draft_kv = FusedDrafter.draft_kv
    monkeypatch.setattr(FusedDrafter, "draft_kv", lambda self, ids, hidden, positions: draft_kv(self, ids, hidden,
                                                                                                  positions + 1))
    with pytest.raises(AssertionError):
        test_drafter.test_draft_kv_matches_twin(device, True, torch.bfloat16, 5)


def test_draft_extend_keeping_the_first_row_fails(monkeypatch, device):
    """The lean draft extend hands on the first row of each request instead of its last accepted one (a select index
    that forgets the accept lengths): caught by the twin comparison."""
    extend = FusedDrafter.draft_extend

    def first_row(self, input_ids, hidden, seq_lens, accept_lens, *rest):
        return extend(self, input_ids, hidden, seq_lens, torch.ones_like(accept_lens), *rest)

    monkeypatch.setattr(FusedDrafter, "draft_extend", first_row)
    with pytest.raises(AssertionError):
        test_draft_extend.test_draft_extend_matches_twin(device, True, torch.bfloat16, 5, 4)


def test_draft_extend_storing_its_rows_after_the_attention_fails(monkeypatch, device):
    """The lean draft extend stores its rows' K / V after the kept row's attention (which then reads the pool as it
    was before the extend instead of its own accepted rows): caught by the twin comparison."""
    extend = FusedDrafter.draft_extend

    def store_late(self, input_ids, hidden, seq_lens, accept_lens, req_pool_indices, store_kv, topk):
        stored = []
        out = extend(self, input_ids, hidden, seq_lens, accept_lens, req_pool_indices,
                     lambda k, v: stored.append((k.clone(), v.clone())), topk)
        store_kv(*stored[0])
        return out

    monkeypatch.setattr(FusedDrafter, "draft_extend", store_late)
    with pytest.raises(AssertionError):
        test_draft_extend.test_draft_extend_matches_twin(device, True, torch.bfloat16, 5, 4)


def test_draft_attention_off_by_one_row_fails(monkeypatch, device):
    def corrupt(args, kwargs, out):
        out[:-1] = out[1:].clone()

    monkeypatch.setattr(test_draft_attention, "draft_attention", broken(test_draft_attention.draft_attention, corrupt))
    with pytest.raises(AssertionError):
        test_draft_attention.test_matches_reference(device, [1, 40, 17], 4, 4, 2, 32, 2)


def test_linear_dropping_the_residual_fails(monkeypatch, device):
    linear = test_linear.linear

    def no_residual(x, w, out, *, residual=None, out_sum=None, **kwargs):
        result = linear(x, w, out, **kwargs)
        if out_sum is not None:
            out_sum.copy_(out.float())
        return result

    monkeypatch.setattr(test_linear, "linear", no_residual)
    with pytest.raises(AssertionError):
        test_linear.test_fused_variants(device, 5, dict(residual=True))


def _tile_rule_before_the_shard_sweeps(M, N, K, silu_mul, x_bytes, gpu):
    """linear's tile rule before the TP shard sweeps: columns halved to 16 for 128+ programs, BLOCK_K 128."""
    block_n = 64
    while block_n > 16 and -(-N // block_n) < 128:
        block_n //= 2
    return (16 if M <= 16 else 32), block_n, 128, 4


@pytest.mark.parametrize("rule", ["linear", "lm_head"])
def test_tile_rules_before_the_shard_sweeps_fail(monkeypatch, rule):
    """Each tile rule as it was before the TP shard sweeps (1.2-1.6x the best tile there) fails the sweep test."""
    if rule == "linear":
        monkeypatch.setattr(test_linear, "_config", _tile_rule_before_the_shard_sweeps)
    else:
        monkeypatch.setattr(test_linear, "_tile_pass_config", lambda R, H, tiles, x_bytes, gpu: (16, 128, 4))
    assert test_linear.SWEEPS
    for sweep in test_linear.SWEEPS:
        with pytest.raises(AssertionError):
            test_linear.test_tile_rules_pick_the_sweeps_best_tiles(sweep)


def test_rms_norm_without_its_weight_fails(monkeypatch, device):
    rms_norm = test_rms_norm.rms_norm
    monkeypatch.setattr(test_rms_norm, "rms_norm", lambda x, weight, eps: rms_norm(x, torch.ones_like(weight), eps))
    with pytest.raises(AssertionError):
        test_rms_norm.test_matches_reference(device, 3, 96, "model", torch.bfloat16)


def test_lm_head_topk_second_best_first_fails(monkeypatch, device):
    def corrupt(args, kwargs, result):
        p, index = result
        p[:, :2] = p[:, :2].flip(-1).clone()
        index[:, :2] = index[:, :2].flip(-1).clone()

    monkeypatch.setattr(test_lm_head_topk, "lm_head_topk", broken(test_lm_head_topk.lm_head_topk, corrupt))
    with pytest.raises(AssertionError):
        test_lm_head_topk.test_matches_reference(device, 1)  # topk 4


def test_draft_select_wrong_hidden_row_fails(monkeypatch, device):
    def corrupt(args, kwargs, result):
        hidden_rows = args[6]
        hidden_rows.copy_(hidden_rows.flip(0))

    monkeypatch.setattr(test_draft_select, "draft_select", broken(test_draft_select.draft_select, corrupt))
    with pytest.raises(AssertionError):
        test_draft_select.test_draft_tree_selection(device, 3, 2, 3, 5)


def test_draft_organize_unsorted_fails(monkeypatch, device):
    def corrupt(args, kwargs, result):
        args[2].copy_(args[2].flip(-1))
        args[3].copy_(args[3].flip(-1))

    monkeypatch.setattr(test_draft_select, "draft_organize", broken(test_draft_select.draft_organize, corrupt))
    with pytest.raises(AssertionError):
        test_draft_select.test_draft_tree_selection(device, 1, 4, 3, 8)


def test_embed_shard_without_its_mask_fails(monkeypatch, device):
    """The lookup clamped into the shard but not masked: ids of other ranks read a row of this one."""

    def corrupt(args, kwargs, result):
        ids, table, offset, valid, out = args
        local = (ids - offset).clamp(0, max(valid - 1, 0))
        out.copy_(table[local])

    monkeypatch.setattr(test_embed_shard, "embed_shard", broken(test_embed_shard.embed_shard, corrupt))
    with pytest.raises(AssertionError):
        test_embed_shard.test_every_rank_matches_the_twin_and_the_ranks_sum_to_the_embedding(
            device, 7, 96, 300, 4, torch.bfloat16)


def test_build_tree_swapping_child_and_sibling_links_fails(monkeypatch, device):
    build_tree_ = test_build_tree.kernels.build_tree_

    def corrupt(args, kwargs, result):
        next_token, next_sibling = args[6], args[7]
        swapped = next_token.clone()
        next_token.copy_(next_sibling)
        next_sibling.copy_(swapped)

    monkeypatch.setattr(test_build_tree.kernels, "build_tree_", broken(build_tree_, corrupt))
    with pytest.raises(AssertionError, match="next_token"):
        test_build_tree.test_sglang_example(test_build_tree.QLEN_ONLY, device)


def test_verify_greedy_accepting_one_token_fewer_fails(monkeypatch, device):
    def corrupt(args, kwargs, result):
        accept_token_num = args[2]
        accept_token_num.copy_((accept_token_num - 1).clamp_min(0))

    one_fewer = broken(test_verify_greedy.verify_tree_greedy, corrupt)
    monkeypatch.setattr(test_verify_greedy, "verify_tree_greedy", one_fewer)
    with pytest.raises(AssertionError):
        test_verify_greedy.test_chain_full_and_zero_acceptance(device, 11, 10)


def test_verify_attention_dropping_the_tree_mask_fails(monkeypatch, device):
    """The tree read as a chain (the mask dropped: causal over the draft tokens)."""
    attend = test_verify_attention.verify_attention

    def as_chain(q, k_ext, v_ext, o, k_buf, v_buf, qo, kv, idx, mask, mask_indptr, *args, **kwargs):
        return attend(q, k_ext, v_ext, o, k_buf, v_buf, qo, kv, idx, None, None, *args, **kwargs)

    monkeypatch.setattr(test_verify_attention, "verify_attention", as_chain)
    with pytest.raises(AssertionError):
        test_verify_attention.test_matches_reference(device, 3, [1, 37, 70], 6, 8, 2, 64, True, torch.bfloat16)


class _Launch:
    """Stands in for a jitted kernel: ``_Launch(fn)[grid](*args, **kwargs)`` calls ``fn(*args, **kwargs)``."""

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        return self.fn


def _merge_without_weights(o, part_o, part_lse, qo_indptr, kv_indptr, *strides, DV, SPLITS, SPLIT_TOKENS, **meta):
    """A merge of the split partials that averages them (their log-sum-exp weights ignored)."""
    parts = part_o.view(o.shape[0], o.shape[1], SPLITS, DV)
    for b in range(qo_indptr.shape[0] - 1):
        prefix = int(kv_indptr[b + 1] - kv_indptr[b])
        used = max(1, min(SPLITS, -(-prefix // SPLIT_TOKENS)))
        if used > 1:
            q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
            o[q0:q1] = parts[q0:q1, :, :used].mean(dim=2).to(o.dtype)


@pytest.mark.parametrize("merge", ["dropped", "unweighted"])
def test_verify_attention_with_a_broken_split_merge_fails(monkeypatch, device, merge):
    """Split prefixes whose partials are never merged (their rows left as they were), or averaged."""
    from sgl_eagle_triton.kernels import verify_attention as kernel

    broken_merge = {"dropped": lambda *args, **kwargs: None, "unweighted": _merge_without_weights}
    monkeypatch.setattr(kernel, "_merge_splits_kernel", _Launch(broken_merge[merge]))
    with pytest.raises(AssertionError):
        test_verify_attention.test_split_prefixes_match_the_reference(device, 3, [1, 130, 450], 6, 64, 4)


def _merge_in_bf16(o, part_o, part_lse, qo_indptr, kv_indptr, *strides, DV, SPLITS, SPLIT_TOKENS, **meta):
    """The split partials' merge with the partials rounded to bf16 first (weights and sum in fp32): the precision a
    merge through a 16-bit scratch would keep."""
    parts = part_o.view(o.shape[0], o.shape[1], SPLITS, DV).to(torch.bfloat16).float()
    lse = part_lse.view(o.shape[0], o.shape[1], SPLITS)
    for b in range(qo_indptr.shape[0] - 1):
        prefix = int(kv_indptr[b + 1] - kv_indptr[b])
        used = max(1, min(SPLITS, -(-prefix // SPLIT_TOKENS)))
        if used > 1:
            q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
            weights = torch.exp2(lse[q0:q1, :, :used] - lse[q0:q1, :, :used].amax(dim=2, keepdim=True))
            merged = (parts[q0:q1, :, :used] * weights[..., None]).sum(dim=2) / weights.sum(dim=2)[..., None]
            o[q0:q1] = merged.to(o.dtype)


@pytest.mark.parametrize("score_std", [1.0, 4.0])
def test_verify_attention_merging_splits_in_bf16_fails(monkeypatch, device, score_std):
    """A precision loss, not a wrong answer: the partials rounded to bf16 before the merge (every output still
    within the parity tests' tolerance of the twin) lifts the error above its measured multiple of the floor."""
    from sgl_eagle_triton.kernels import verify_attention as kernel

    monkeypatch.setattr(kernel, "_merge_splits_kernel", _Launch(_merge_in_bf16))
    with pytest.raises(AssertionError):
        test_verify_attention.test_error_is_near_the_rounding_floor(device, torch.bfloat16, score_std, "split")


def test_target_probs_ignoring_min_p_fails(monkeypatch, device):
    prepare = test_target_probs.prepare_target_probs

    def no_min_p(logits, temperatures, top_ks, top_ps, min_ps, *args, **kwargs):
        return prepare(logits, temperatures, top_ks, top_ps, torch.zeros_like(min_ps), *args, **kwargs)

    monkeypatch.setattr(test_target_probs, "prepare_target_probs", no_min_p)
    with pytest.raises(AssertionError):
        test_target_probs.test_every_filter_combination(device, test_target_probs.ALL, 1.0, 0.1)


def test_tree_sampling_with_mirrored_coins_fails(monkeypatch, device):
    sample = test_tree_sampling.tree_speculative_sampling

    def mirrored_coins(*args, **kwargs):  # args: 3 outputs, candidates, 3 tree links, coins, ...
        args = list(args)
        args[7] = 1 - args[7]
        return sample(*args, **kwargs)

    monkeypatch.setattr(test_tree_sampling, "tree_speculative_sampling", mirrored_coins)
    with pytest.raises(AssertionError):
        for seed in range(6):
            test_tree_sampling.test_matches_reference(device, seed)


def test_verify_greedy_without_the_bonus_token_of_a_one_node_tree_fails(monkeypatch, device):
    """Adaptive steps 0 (SGLang's one-node tree): a launcher that leaves the root's prediction unwritten."""
    def corrupt(args, kwargs, result):
        if args[3].shape[1] == 1:  # candidates [bs, 1]
            args[0].zero_()

    no_bonus = broken(test_verify_greedy.verify_tree_greedy, corrupt)
    monkeypatch.setattr(test_verify_greedy, "verify_tree_greedy", no_bonus)
    with pytest.raises(AssertionError):
        test_verify_greedy.test_single_node_tree_is_a_plain_decode(device, 5)


def test_draft_worker_ignoring_the_shape_in_force_fails(monkeypatch, device):
    """Adaptive speculation: a draft worker that keeps its first drafter whatever shape SGLang puts in force."""
    from sgl_eagle_triton.worker import TritonEagleDraftWorker
    from tests import test_worker

    shape_of = TritonEagleDraftWorker.fused_drafter.fget

    def first_drafter(self):
        if not self._drafters:
            return shape_of(self)
        return next(iter(self._drafters.values()))

    monkeypatch.setattr(TritonEagleDraftWorker, "fused_drafter", property(first_drafter))
    with pytest.raises(AssertionError):
        test_worker.test_draft_forward_runs_the_shape_in_force({}, device)


def test_adaptive_policy_blind_to_cost_fails(monkeypatch):
    """A policy that maximises expected tokens alone keeps the deepest chain in a crowd."""
    from sgl_eagle_triton.adaptive import CostAwarePolicy
    from tests import test_adaptive

    monkeypatch.setattr(CostAwarePolicy, "value", lambda self, steps, bs: self.acceptance.expected_tokens(steps))
    with pytest.raises(AssertionError):
        test_adaptive.test_high_acceptance_drafts_deep_alone_and_shallow_in_a_crowd()


def test_tree_evidence_crediting_the_next_rank_fails(monkeypatch, device):
    """An accepted child counted one sibling rank late (its successes on the wrong rank): caught by the twin."""

    def corrupt(args, kwargs, result):
        passed = args[1]
        passed.copy_(passed.roll(1, dims=1))

    monkeypatch.setattr(test_tree_evidence, "tree_evidence", broken(test_tree_evidence.tree_evidence, corrupt))
    with pytest.raises(AssertionError, match="passed"):
        test_tree_evidence.test_matches_twin(device, test_tree_evidence.CASES[2], True)


def test_tree_evidence_reading_one_draft_too_many_fails(monkeypatch, device):
    """SGLang's accept lengths (drafts + 1) walked as accepted drafts (the bonus not taken off): one level too deep
    on every request that stopped early, caught where the level past the accepted path is not -1."""
    real = test_tree_evidence.tree_evidence
    monkeypatch.setattr(test_tree_evidence, "tree_evidence",
                        lambda *args, bonus_included=False: real(*args, bonus_included=False))
    with pytest.raises(AssertionError, match="tried|passed"):
        test_tree_evidence.test_matches_twin(device, test_tree_evidence.CASES[2], True)


def test_verify_epilogue_with_chain_links_one_node_long_fails(monkeypatch, device):
    """The in-graph verify's chain: each node linked to the node after its child."""
    chain = test_verify_epilogue.chain_tree

    def long_links(bs, n, device):
        index, next_token, sibling = chain(bs, n, device)
        return index, torch.where(next_token + 1 < n, next_token + 1, -1), sibling

    monkeypatch.setattr(test_verify_epilogue, "chain_tree", long_links)
    with pytest.raises(AssertionError):
        test_verify_epilogue.test_the_chain_tree_is_build_trees_tree_of_topk_1(3, 3, device)


def test_verify_epilogue_writing_one_accepted_token_fewer_fails(monkeypatch, device):
    """The in-graph verify's walk stopping one token early (its kernel's count and index corrupted)."""
    from sgl_eagle_triton import verify_epilogue

    def corrupt(args, kwargs, result):
        args[2].copy_((args[2] - 1).clamp_min(0))

    monkeypatch.setattr(verify_epilogue, "verify_tree_greedy", broken(verify_epilogue.verify_tree_greedy, corrupt))
    with pytest.raises(AssertionError):
        test_verify_epilogue.test_the_graph_writes_the_reference_walks_outputs(4, 3, device)
