"""The kernels a decode step runs outside CUDA graphs are compiled at start-up for every tree shape the server
verifies (worker.EagleTritonWorkerV2.compile_eager_kernels): on a GPU, serving afterwards compiles nothing new;
on the CPU, the start-up calls run (interpreter) and the worker makes them for every state."""

import random
from types import SimpleNamespace

import pytest
import torch

from sgl_eagle_triton import simulated_acceptance, verify, worker
from sgl_eagle_triton.adaptive import CostAwarePolicy, TreeEvidence
from sgl_eagle_triton.kernels import simulated_walk, target_probs, tree_evidence, tree_sampling, verify_greedy
from tests import tree_cases
from tests.sglang_compat import adaptive_trees

# (draft tokens n, steps): steps 0's one node, a chain of odd n (its rows' alignment follows the batch's parity), a
# chain, trees of 16 and 32 nodes (Triton compiles an integer argument apart when it is 1 or a multiple of 16:
# target_probs takes n as one)
SHAPES = [(1, 0), (3, 2), (4, 3), (16, 5), (32, 5)]
KERNELS = [verify_greedy._verify_tree_greedy_kernel, target_probs._stats_kernel, target_probs._search_kernel,
           target_probs._write_kernel, tree_sampling._walk_kernel, tree_sampling._correction_kernel,
           simulated_walk._simulated_walk_kernel, tree_evidence._tree_evidence_kernel]


def serving_tree(n: int, steps: int, bs: int, vocab: int, device):
    """``(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling)`` as serving builds them: for a
    tree, random links (tree_cases.make_tree) in the three [bs, n] int64 views of one [3, bs, n] buffer that
    build_tree_kernel_efficient returns, int64 draft tokens; for steps 0, SGLang 0.5.17's one-node rows
    (EAGLEWorkerV2's steps-0 verify input: separate arange / full tensors, its int32 bonus tokens as draft tokens)."""
    if n == 1:
        return (torch.randint(0, vocab, (bs, 1), dtype=torch.int32, device=device),
                torch.arange(bs, dtype=torch.long, device=device).unsqueeze(1),
                torch.full((bs, 1), -1, dtype=torch.long, device=device),
                torch.full((bs, 1), -1, dtype=torch.long, device=device))
    rng = random.Random(n * 1000 + bs)
    rows = torch.empty(3, bs, n, dtype=torch.long, device=device)
    for b in range(bs):
        next_token, next_sibling, _ = tree_cases.make_tree(rng, n, steps, 4)
        rows[0, b] = torch.arange(b * n, (b + 1) * n)
        rows[1, b], rows[2, b] = torch.tensor(next_token), torch.tensor(next_sibling)
    return torch.randint(0, vocab, (bs * n,), device=device).reshape(bs, n), *rows


def serve_like_sglang(n: int, steps: int, bs: int, vocab: int, device) -> None:
    """One greedy and one sampled verify of ``bs`` requests, the tensors built as SGLang 0.5.17's ``eagle_sample`` and
    ``SamplingBatchInfo`` build them (verify.eagle_sample's sampled path), and the simulated walk and the tree counts
    as the benchmark and the cost policy run them."""
    tree = serving_tree(n, steps, bs, vocab, device)
    logits = torch.randn(bs * n, vocab, device=device)

    def outputs():
        return (torch.zeros(bs * n, dtype=torch.int32, device=device),
                torch.full((bs, steps + 1), -1, dtype=torch.int32, device=device),
                torch.empty(bs, dtype=torch.int32, device=device))

    verify_greedy.verify_tree_greedy(*outputs(), *tree, torch.argmax(logits, dim=-1).reshape(bs, n))
    temperatures = torch.full((bs, 1), 0.7, dtype=torch.float, device=device)
    top_ks = torch.full((bs,), 1 << 30, dtype=torch.int32, device=device)
    top_ps, min_ps = (torch.full((bs,), x, dtype=torch.float, device=device) for x in (0.9, 0.0))
    probs = target_probs.prepare_target_probs(logits.contiguous(), temperatures.view(-1), top_ks, top_ps, min_ps, n)
    coins = torch.rand_like(tree[0], dtype=torch.float32, device=device)
    tree_sampling.tree_speculative_sampling(*outputs(), *tree, coins, torch.rand(bs, device=device),
                                            probs.view(bs, n, -1))
    table = simulated_acceptance.cumulative_probs(**simulated_acceptance.PROFILES["llama31-8b-eagle3"]).to(device)
    simulated_walk.simulated_walk(*outputs(), tree[0].contiguous(), *tree[1:], torch.rand(bs, steps + 1,
                                                                                         device=device), table)
    if n > 1:
        tables = torch.zeros(2, 8, 4, device=device)
        predict, accept_index, accepted = outputs()
        tree_evidence.tree_evidence(tables[0], tables[1], accept_index, accepted.fill_(1), *tree[1:],
                                    bonus_included=True)  # as TreeEvidence.add: SGLang's accept lengths


def compiled() -> list[int]:
    device = torch.cuda.current_device()
    return [len(kernel.device_caches[device][0]) for kernel in KERNELS]


@pytest.mark.gpu
def test_serving_after_start_up_compiles_nothing_new(monkeypatch):
    """Compiled at start for each shape, then served at batch sizes 1, 7 and 64: no kernel gains a variant (a start-up
    call with another dtype or constant than serving's would leave serving to compile: the 2026-11-27 H200 sweep's
    stall)."""
    vocab = 1000
    monkeypatch.setenv(simulated_acceptance.PROFILE_ENV, "llama31-8b-eagle3")
    monkeypatch.setenv(simulated_acceptance.BENCHMARK_ENV, "1")
    verify.compile_verify_kernels(SHAPES, vocab, "cuda")
    simulated_acceptance.compile_walk(SHAPES, "cuda")
    TreeEvidence(7, 4, "cuda").compile(SHAPES)
    before = compiled()
    for n, steps in SHAPES:
        for bs in (1, 2, 7, 64):
            serve_like_sglang(n, steps, bs, vocab, "cuda")
    torch.cuda.synchronize()
    after = compiled()
    assert after == before, {k.fn.__name__: (b, a) for k, b, a in zip(KERNELS, before, after, strict=True) if a != b}


def test_start_up_compile_calls_run_for_every_shape(device, monkeypatch):
    """The start-up calls themselves (interpreted on the CPU): every kernel launched once per shape, steps 0's one-node
    tree included, with serving's compile-time shape (n, steps + 1)."""
    launched = []

    def spy(module, name):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, **k: launched.append((name, a[3].shape[1], a[1].shape[1]))
                            or real(*a, **k))

    spy(verify, "verify_tree_greedy")
    spy(verify, "tree_speculative_sampling")
    verify.compile_verify_kernels([(4, 3), (1, 0), (4, 3)], 50, device)
    assert launched == [(name, n, steps + 1) for n, steps in [(1, 0), (4, 3)] for _ in (1, 2)
                        for name in ("verify_tree_greedy", "tree_speculative_sampling")]
    monkeypatch.setenv(simulated_acceptance.PROFILE_ENV, "llama31-8b-eagle3")
    monkeypatch.setenv(simulated_acceptance.BENCHMARK_ENV, "1")
    simulated_acceptance.compile_walk([(4, 3), (1, 0)], device)
    evidence = TreeEvidence(3, 4, device)
    evidence.compile([(4, 3), (1, 0)])
    assert not evidence.tables.any()  # scratch tables: the policy's counts untouched


def test_the_worker_compiles_every_states_shape_before_serving(monkeypatch):
    """Static: the server's one shape; adaptive: every candidate's (tree candidates: the config's draft tokens), and
    steps 0's KV fill when steps 0 is a candidate."""
    calls = []
    monkeypatch.setattr(worker.verify, "compile_verify_kernels", lambda shapes, vocab, device: calls.append(
        ("verify", sorted(shapes), vocab)))
    monkeypatch.setattr(worker.simulated_acceptance, "compile_walk", lambda shapes, device: calls.append(
        ("walk", sorted(shapes))))
    w = worker.EagleTritonWorkerV2.__new__(worker.EagleTritonWorkerV2)
    w.device, w.cost_policy, w.adaptive_controller = "cpu", None, None
    w.speculative_num_steps, w.speculative_num_draft_tokens = 5, 16
    w._target_worker = SimpleNamespace(model_runner=SimpleNamespace(model_config=SimpleNamespace(vocab_size=321)))
    w._draft_worker = SimpleNamespace(compile_draft_kv=lambda: calls.append(("draft kv",)))
    w.compile_eager_kernels()
    assert calls == [("verify", [(16, 5)], 321), ("walk", [(16, 5)])]
    calls.clear()
    w.adaptive_controller = SimpleNamespace(candidate_steps=[0, 1, 3, 5])
    w.server_args = SimpleNamespace(speculative_eagle_topk=4)
    adaptive_trees(monkeypatch, {1: (4, 2), 3: (1, 4), 5: (4, 16)})
    w.cost_policy = CostAwarePolicy([0, 1, 3, 5], 3)
    w.cost_policy.evidence = SimpleNamespace(compile=lambda shapes: calls.append(("evidence", sorted(shapes))))
    w.compile_eager_kernels()
    shapes = [(1, 0), (2, 1), (4, 3), (16, 5)]
    assert calls == [("verify", shapes, 321), ("walk", shapes), ("evidence", shapes), ("draft kv",)]


@pytest.mark.gpu
def test_the_check_catches_a_start_up_call_unlike_serving():
    """The check above, shown to fail: a start-up call with top-k as int64 (SGLang's is int32) and no sampled walk
    leaves serving to compile. A vocabulary and a shape of their own, so that nothing else compiled them: the kernels
    taking top-k compile again, the one that does not (the statistics pass) does not."""
    n, steps, vocab = 8, 7, 1003
    ones = torch.ones(1, device="cuda")
    target_probs.prepare_target_probs(torch.zeros(n, vocab, device="cuda"), ones,
                                      torch.full((1,), 1 << 30, dtype=torch.int64, device="cuda"), ones,
                                      torch.zeros_like(ones), n)
    before = compiled()
    serve_like_sglang(n, steps, 7, vocab, "cuda")
    torch.cuda.synchronize()
    grew = {k.fn.__name__ for k, b, a in zip(KERNELS, before, compiled(), strict=True) if a > b}
    assert {"_search_kernel", "_write_kernel", "_walk_kernel"} <= grew and "_stats_kernel" not in grew, grew


def test_start_up_chains_are_laid_out_as_serving_lays_out_trees():
    """chain_tree gives both alignments serving gives retrieve_next_token (one [3, bs, n] buffer: 16-byte aligned
    only when bs * n is even) and steps 0's int32 bonus tokens as draft tokens."""
    from sgl_eagle_triton.kernels.tree_rows import chain_tree

    candidates, index, next_token, next_sibling = chain_tree(3, 1, "cpu")
    assert candidates.dtype == index.dtype == torch.int64 and next_token.data_ptr() % 16 == 8
    assert next_token.tolist() == [[1, 2, -1]] and next_sibling.tolist() == [[-1, -1, -1]]
    _, index, next_token, _ = chain_tree(3, 2, "cpu")
    assert next_token.data_ptr() % 16 == 0 and index.tolist() == [[0, 1, 2], [3, 4, 5]]
    candidates, index, next_token, next_sibling = chain_tree(1, 2, "cpu")
    assert candidates.dtype == torch.int32 and index.tolist() == [[0], [1]] and next_token.tolist() == [[-1], [-1]]
