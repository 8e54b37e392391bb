"""The benchmark harness's pure-Python part (report formatting) runs in CPU CI so it cannot rot."""

import pytest

from bench import drafter, kernels


def test_markdown_table_has_one_line_per_case():
    """One line per op and case, ours over the comparator: stock's op, or for an op with no stock twin (embed_shard,
    `--embed-shard-only`) the torch code it replaced, "(before)"."""
    rows = []
    for op, other in (("build_tree", "sgl-kernel CUDA (stock)"), ("embed_shard_tp4", "torch mask chain (before)")):
        for impl, eager in (("triton (ours)", 5.0), (other, 10.0)):
            for bs in (1, 8):
                rows.append(dict(op=op, impl=impl, steps=5, topk=4, draft_tokens=16, batch=bs, eager_us=eager,
                                 graph_us=eager / 2, graph_over_floor=100.0, sglang_version="0.5.17"))
    table = kernels.markdown(rows, "GPU X", 3e12, 4.0)
    assert "# Tree kernels on GPU X, SGLang 0.5.17" in table
    for op in ("build_tree", "embed_shard_tp4"):
        lines = [line for line in table.splitlines() if line.startswith(f"| {op} ")]
        assert len(lines) == 2 and all("| 0.50 |" in line for line in lines)


def test_drafter_markdown():
    draft_rows = [dict(steps=5, topk=8, draft_tokens=32, batch=1, graph_us=1500.0, floor_us=1000.0, over_floor=1.5)]
    op_rows = [dict(op="qkv", impl=impl, rows=8, graph_us=t, floor_us=30.0, over_floor=t / 30.0)
               for impl, t in (("triton (ours)", 36.0), ("cuBLAS + torch", 40.0))]
    table = drafter.markdown(draft_rows, op_rows, "GPU X", 3e12)
    assert "| 5,8,32 | 1 | 1500 | 1000 | 1.50 |" in table and "| qkv | 8 | 36.0 | 40.0 | 30.0 | 1.20 | 0.90 |" in table
    chain = {"5,8,32, batch 1": [dict(kernel="_linear_kernel", us=38.04), dict(kernel="_merge_kernel", us=2.5),
                 dict(kernel="_linear_kernel", us=10.0)]}
    assert "at 5,8,32, batch 1 (eager, profiler device time): _linear_kernel 2x 48.0 us, _merge_kernel 1x 2.5 us" in \
        drafter.markdown(draft_rows, op_rows, "GPU X", 3e12, chain)
    assert "Rank 0 of `--tp 4`" in drafter.markdown(draft_rows, op_rows, "GPU X", 3e12, chain, tp=4)
    assert drafter.gpu_run_setup is kernels.gpu_run_setup


def test_drafter_kv_markdown_compares_each_format_with_bf16_page1():
    rows = [dict(steps=5, topk=8, draft_tokens=32, batch=8, kv_cache_dtype=kv, page_size=page, graph_us=t,
                 floor_us=500.0, over_floor=t / 500.0)
            for kv, page, t in (("bf16", 1, 1000.0), ("bf16", 16, 1010.0), ("fp8_e4m3", 1, 950.0))]
    table = drafter.kv_markdown(rows, "GPU X", 3e12)
    assert "| 5,8,32 | 8 | bf16 | 16 | 1010 | 500 | 2.02 | 1.010 |" in table
    assert "| 5,8,32 | 8 | fp8_e4m3 | 1 | 950 | 500 | 1.90 | 0.950 |" in table
    assert [kv for kv, _ in drafter.KV_FORMATS][:1] == [None] and drafter.kv_name(None) == "bf16"


def test_tree_shape_monte_carlo():
    """bench.tree_shape: a flat draft's (5,8,32) trees stay 2 levels deep and commit less than the chain of 3 under
    the tree-aware profile; a confident draft's grow deeper and commit more; chains are deterministic."""
    from bench import tree_shape
    from sgl_eagle_triton.adaptive import chain_tokens
    from sgl_eagle_triton.simulated_acceptance import PROFILES

    flat_tokens, flat_depth = tree_shape.shape_stats(5, 8, 32, 1.28, trials=3)
    sure_tokens, sure_depth = tree_shape.shape_stats(5, 8, 32, 5.0, trials=3)
    assert flat_depth == 2.0 and flat_tokens < 3.0 and sure_depth >= 4.0 and sure_tokens > 3.5
    p = PROFILES["llama31-8b-eagle3"]
    chain = chain_tokens(p["rank_probs"][0] * p["depth_decay"] ** d for d in range(3))
    assert tree_shape.shape_stats(3, 1, 4, 5.0, trials=2)[0] == pytest.approx(chain)
    tokens = tree_shape.expected_tokens([(0,), (1,), (0, 0)], [0.5, 0.25], 1.0)
    assert tokens == pytest.approx(1 + 0.5 + 0.25 + 0.5 * 0.5)


def test_one_rank_of_the_drafter_runs_with_local_stand_ins_for_the_collectives(device):
    """``bench.drafter --tp N``: rank 0's shards (SGLang's split of heads, MLP columns and vocabulary), an all-reduce
    that returns its input and an all-gather of N copies; the draft runs and its LM head merges N parts."""
    import torch

    from sgl_eagle_triton.devtools.testing import random_batch, random_draft
    from sgl_eagle_triton.drafter import FusedDrafter

    w, gen = random_draft(True, device, H=64, Hq=4, Hkv=2, D=16, inter=96, vocab=300, draft_vocab=120)
    local, parallel, heads = drafter.rank_weights(w, 2)
    assert drafter.rank_weights(w, 1) == (w, None, slice(None)) and drafter.tp_size((local, parallel, heads)) == 2
    assert local.qkv.shape == ((2 + 1 + 1) * 16, 128) and local.lm_head.shape == (60, 64) and heads == slice(0, 1)
    assert parallel.all_gather(torch.arange(3)).tolist() == [[0, 1, 2], [0, 1, 2]]
    part = torch.ones(2)
    assert parallel.all_reduce(part) is part
    b = random_batch(w, 2, 2, 3, [5, 9], gen, device)
    d = FusedDrafter(local, 2, 3, 4, b["k_cache"][:, heads].contiguous(), b["v_cache"][:, heads].contiguous(),
                     b["req_to_token"], tp=parallel)
    parents, selected, tokens, scores = d.draft(b["topk_p"], b["topk_index"], b["hidden"], b["positions"],
                                                b["seq_lens"], b["req_pool_indices"])
    assert tokens.shape == (2, 3) and bool((tokens >= 0).all())


@pytest.mark.parametrize("tp", [1, 2])
def test_every_per_op_case_runs_on_the_ranks_shapes(device, tp):
    """``bench.drafter``'s per-op cases (ours and cuBLAS + torch) on a small draft, whole and as rank 0 of 2 (its
    o_proj takes the rank's attention columns; its LM head is a shard top-k + merge)."""
    from sgl_eagle_triton.devtools.testing import random_draft

    w, _ = random_draft(True, device, H=64, Hq=4, Hkv=2, D=16, inter=96, vocab=300, draft_vocab=120)
    for ours, reference, weight in drafter.op_cases(w, 3, drafter.rank_weights(w, tp), device).values():
        ours(weight), reference(weight)


def test_stage_split_takes_medians_of_rank_0_after_the_skipped_lines():
    """bench.stage_split: the scheduler stage lines and the worker's host time in forward of one server log, rank 0
    only, the first line (warm-up) skipped; a log without lines gives '-' cells."""
    from bench import stage_split

    def stage_line(rank, period, run_batch):
        return (f"[TP{rank}] EAGLE_TRITON scheduler stages, rank {rank}, 200 decode iterations: period {period:.3f} ms"
                f" = process_input_requests 0.100 + get_next_batch_to_run 0.200 + run_batch {run_batch:.3f} + "
                f"_apply_war_barrier 0.010 + process_batch_result 0.500 + rest 0.190 (ms); garbage collection 0.050 "
                f"ms, full 0.020 ms\n")

    def cycle_line(in_forward):
        return (f"EAGLE_TRITON cycle timing, rank 0, 200 decode steps (199 after another): host period 3.00 ms "
                f"({in_forward:.2f} ms in forward_batch_generation), gpu step 1.00 ms + idle 2.00 ms\n")

    def parts_line(rank, forward):
        return (f"EAGLE_TRITON run_batch parts, rank {rank}, 200 decode iterations: resolve_seq_lens_cpu 0.010 + "
                f"resolve_forward_inputs 0.020 + forward_batch_generation {forward:.3f} + record_batch_in_overlap "
                f"0.030 + _relay_forward_payload 0.040 + copy_to_cpu 0.050 + other 0.060 (ms)\n")

    def sglang_line(rank, prepare):
        return (f"EAGLE_TRITON sglang parts, rank {rank}, 200 decode iterations: new_tokens_required_next_decode "
                f"0.011 + prepare_for_decode {prepare:.3f} + init_new 0.031 + model_forward 0.041 + sample 0.000 + "
                f"process_batch_result_decode 0.051 + stream_output 0.061 (ms)\n")

    log = (stage_line(0, 99.0, 99.0) + cycle_line(9.0) + parts_line(0, 9.0) + sglang_line(0, 9.0)
           + stage_line(0, 3.0, 2.0) + stage_line(1, 50.0, 50.0) + parts_line(1, 50.0) + sglang_line(1, 50.0)
           + cycle_line(1.5) + parts_line(0, 1.2) + sglang_line(0, 0.2)
           + stage_line(0, 3.2, 2.2) + stage_line(0, 3.4, 2.4) + cycle_line(1.7) + cycle_line(1.6) + parts_line(0, 1.4)
           + sglang_line(0, 0.4))
    row = stage_split.split(log)
    assert row["lines"] == 3 and row["period"] == 3.2 and row["run_batch"] == 2.2 and row["rest"] == 0.19
    assert row["host_in_forward"] == 1.6 and row["run_batch: forward_batch_generation"] == pytest.approx(1.3)
    assert row["sglang: prepare_for_decode"] == pytest.approx(0.3) and row["sglang: sample"] == 0.0
    text = stage_split.table({"ours": row, "nospec": stage_split.split("")})
    assert ("| ours | 3 | 3.200 | 0.100 | 0.200 | 2.200 | 0.010 | 0.500 | 0.190 | 0.050 | 0.020 | 1.600 | 0.010 | "
            "0.020 | 1.300 | 0.030 | 0.040 | 0.050 | 0.060 | 0.011 | 0.300 | 0.031 | 0.041 | 0.000 | 0.051 | 0.061 |"
            ) in text
    assert "| nospec | 0 |" + " - |" * 24 in text


def test_stage_split_by_batch_keeps_windows_of_one_batch_size():
    """bench.stage_split --by-batch: a summary line goes with the batch size of SGLang's decode log lines since the
    previous rank-0 stage line, its parts line with it; a window whose decode lines name two sizes (the batch changed
    inside it) or none is left out, as is another rank's stage line."""
    from bench import stage_split

    def decode(n):
        return f"[2026-12-02 11:28:36] Decode batch, #running-req: {n}, #token: 40, cuda graph: True\n"

    def stage(period, rank=0):
        return (f"EAGLE_TRITON scheduler stages, rank {rank}, 200 decode iterations: period {period:.3f} ms = "
                f"process_input_requests 0.100 + get_next_batch_to_run 0.200 + run_batch 0.300 + _apply_war_barrier "
                f"0.010 + process_batch_result 0.500 + rest 0.190 (ms); garbage collection 0.000 ms, full 0.000 ms\n")

    def parts(forward):
        return (f"EAGLE_TRITON run_batch parts, rank 0, 200 decode iterations: resolve_seq_lens_cpu 0.010 + "
                f"resolve_forward_inputs 0.020 + forward_batch_generation {forward:.3f} + record_batch_in_overlap "
                f"0.030 + _relay_forward_payload 0.040 + copy_to_cpu 0.050 + other 0.060 (ms)\n")

    def sglang(prepare):
        return (f"EAGLE_TRITON sglang parts, rank 0, 200 decode iterations: new_tokens_required_next_decode 0.010 + "
                f"prepare_for_decode {prepare:.3f} + init_new 0.030 + model_forward 0.040 + sample 0.000 + "
                f"process_batch_result_decode 0.050 + stream_output 0.060 (ms)\n")

    log = (decode(1) + decode(1) + stage(1.0) + parts(0.5) + sglang(0.1) + decode(1) + stage(1.2) + parts(0.7)
           + decode(1) + decode(4) + stage(9.0) + parts(9.0)  # the batch changed inside: left out
           + decode(4) + stage(2.0, rank=1) + stage(2.0) + parts(1.5) + stage(7.0) + parts(7.0)  # no decode line
           + decode(4) + stage(2.4) + parts(1.9))
    texts = stage_split.by_batch(log)
    assert list(texts) == [1, 4]
    one, four = (stage_split.split(texts[b], skip=0) for b in (1, 4))
    assert one["lines"] == 2 and one["period"] == pytest.approx(1.1)
    assert one["run_batch: forward_batch_generation"] == pytest.approx(0.6)
    assert one["sglang: prepare_for_decode"] == pytest.approx(0.1)  # the window's own line only
    assert four["lines"] == 2 and four["period"] == pytest.approx(2.2)
    assert four["run_batch: forward_batch_generation"] == pytest.approx(1.7)


def test_the_policy_simulation_shows_the_probe_leaving_steps_0_for_easy_requests():
    """bench.policy_sim (docs/off-step-design.md section 6): after hard requests the cost policy without a probe stays
    at steps 0 for the easy ones that follow (it learns no acceptance there); with steps 0's probe it drafts again,
    and on traffic where drafting never pays it loses at most 2 % (measured: 1.1 % at adaptive.PROBE)."""
    from bench import policy_sim
    from sgl_eagle_triton.adaptive import PROBE

    rates = policy_sim.TRAFFIC["hard, then easy"]
    held = policy_sim.simulate(rates, None, tokens_per_request=100)
    assert held["steps_in_force"].get(0, 0) > 0.95 * sum(held["steps_in_force"].values())
    probed = policy_sim.simulate(rates, PROBE, tokens_per_request=100)
    assert probed["steps_in_force"].get(7, 0) + probed["steps_in_force"].get(5, 0) > 150
    assert probed["tok_per_ms"] > 1.15 * held["tok_per_ms"]
    useless = [policy_sim.simulate(policy_sim.TRAFFIC["useless"], probe)["tok_per_ms"] for probe in (None, PROBE)]
    assert useless[1] > 0.98 * useless[0], useless
    assert policy_sim.simulate(policy_sim.TRAFFIC["easy"][:2], None, tokens_per_request=100)["tok_per_ms"] > 1.0
    assert policy_sim.oracle_tok_per_ms([0.02]) == pytest.approx(1 / policy_sim.OFF_MS)


def test_the_policy_simulation_models_a_slow_start_and_noisy_cycles_and_compares_the_price_cap(capsys):
    """bench.policy_sim --cold / --noise / --cap (docs/adaptive.md, the cap by deeper states)."""
    from bench import policy_sim
    from sgl_eagle_triton.adaptive import PROBE

    rates = policy_sim.TRAFFIC["tiny pair"][:2]
    steady = policy_sim.simulate(rates, PROBE, tokens_per_request=100)["tok_per_ms"]
    cold = policy_sim.simulate(rates, PROBE, tokens_per_request=100, cold=(50, 2.0))["tok_per_ms"]
    assert cold < 0.9 * steady  # 50 of ~90 cycles at twice the time
    noisy = [policy_sim.simulate(rates, PROBE, tokens_per_request=100, noise=0.3, seed=seed)["tok_per_ms"]
             for seed in (0, 0, 1)]
    assert noisy[0] == noisy[1] != noisy[2] and noisy[0] != steady
    policy_sim.main(["--cap", "--seeds", "1", "--cold", "20,1.5"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 1 + 2 * len(policy_sim.TRAFFIC)
    assert [row.split(" | ")[1] for row in rows[1:3]] == ["own prices", "cap by deeper"]


def test_drafter_extend_rows_run_and_tabulate(device, monkeypatch):
    """bench.drafter --extend: the lean extend and the every-row stand-in run on a small draft (their shapes and
    outputs), and the table compares each with the floor and the every-row time."""
    from sgl_eagle_triton.devtools.testing import random_draft

    monkeypatch.setattr(drafter, "PREFIX", 12)
    w, _ = random_draft(True, device)
    p, index, hidden = drafter.extend_once(w, 4, 3, device=device)()
    assert p.shape == index.shape == (3, 1) and hidden.shape == (3, w.hidden_size)
    p, index, hidden = drafter.extend_once(w, 4, 3, every_row=True, device=device)()
    assert p.shape == (12, 1) and hidden.shape == (12, w.hidden_size)
    rows = [dict(draft_tokens=4, batch=1, graph_us=30.0, every_row_us=60.0, floor_us=20.0, over_floor=1.5)]
    table = drafter.extend_markdown(rows, "GPU X", 3e12)
    assert "| 4 | 1 | 30 | 60 | 20 | 1.50 | 0.50 |" in table
