"""The lean draft extend in the draft worker (``TritonEagleDraftWorker.lean_extend``,
``SGLANG_EAGLE_TRITON_LEAN_EXTEND``): what SGLang's draft extend hands the next draft, made by
``FusedDrafter.draft_extend`` (its numerics against SGLang's semantics: tests/test_draft_extend.py) from the
verify's outputs, replayed from graphs per batch size or eagerly; when it runs instead of SGLang's; how it starts
and is refused; its A/B arm."""

import logging
from types import SimpleNamespace

import pytest
import torch

from sgl_eagle_triton import config, worker
from sgl_eagle_triton.devtools.testing import random_batch, random_draft
from sgl_eagle_triton.verify import RAN
from sgl_eagle_triton.worker import EagleTritonWorkerV2, TritonEagleDraftWorker
from tests import fake_sglang
from tests.test_draft_extend import HIDDEN_RTOL
from tests.test_row_graphs import RecordedGraph, recording
from tests.test_worker import check_out_of_memory, fresh_counts  # noqa: F401 (fresh_counts: the fixture)

pytestmark = pytest.mark.usefixtures("fresh_counts")


class _WritingPool:
    """SGLang's draft KV pool as the drafter reads it: ``set_kv_buffer`` writes the pool tensors (16-bit, no scales)
    and records the call."""

    def __init__(self, k_cache, v_cache):
        self.k_cache, self.v_cache, self.writes = k_cache, v_cache, []

    def set_kv_buffer(self, layer, loc, k, v, k_scale=None, v_scale=None):
        self.writes.append((layer, loc.clone(), k_scale, v_scale))
        self.k_cache[loc], self.v_cache[loc] = k, v


def _extend_worker(eagle3, device, n, seed=31, bs=5):
    """``(dw, pool, batch_state, target_hidden, fc)``: a draft worker bound to a random draft and pool (topk 1, ``n``
    draft tokens), its EAGLE-3 ``fc`` over 3 H target features (EAGLE-1: the target's hidden state itself)."""
    w, gen = random_draft(eagle3, device, seed=seed)
    state = random_batch(w, bs, 1, n, [9, 4, 30, 1, 17][:bs], gen, device)
    H = w.hidden_size
    features = 3 * H if eagle3 else H
    fc = torch.nn.Linear(features, H, bias=False).requires_grad_(False)
    fc.weight.copy_(torch.randn(H, features, generator=gen) * features**-0.5)  # seeded: two workers, one draft
    fc = fc.to(w.dtype).to(device)
    dw = TritonEagleDraftWorker.__new__(TritonEagleDraftWorker)
    dw._drafter_binding = (w, state["k_cache"], state["v_cache"], state["req_to_token"], 1.0, 1.0)
    dw._drafters, dw.topk, dw.speculative_num_steps, dw.speculative_num_draft_tokens = {}, 1, 3, n
    dw.server_args = SimpleNamespace(speculative_adaptive=False, speculative_eagle_topk=1)
    dw._draft_attention = SimpleNamespace(k_scale=None, v_scale=None)
    pool = _WritingPool(state["k_cache"], state["v_cache"])
    dw.draft_runner = SimpleNamespace(token_to_kv_pool=pool, model=SimpleNamespace(model=SimpleNamespace(
        fc=fc, num_aux_hidden_states=3)))
    dw.target_worker = SimpleNamespace(model_runner=SimpleNamespace(
        spec_aux_config=SimpleNamespace(eagle_use_aux_hidden_state=eagle3)))
    target_hidden = torch.randn(bs, n, features, generator=gen).to(w.dtype).to(device)
    return dw, pool, state, target_hidden, fc


def _step(state, target_hidden, rows, n, gen_seed=0):
    """A verify's batch and result for the requests ``rows`` of ``state``: next tokens [bs n] int32, target hidden
    states [bs n, features], accept lengths in 1..n, the verify's slots (positions seq_lens .. seq_lens + n - 1)."""
    gen = torch.Generator().manual_seed(gen_seed)
    device = state["seq_lens"].device
    idx = torch.tensor(rows, device=device)
    bs = len(rows)
    seq_lens, rpi = state["seq_lens"][idx], state["req_pool_indices"][idx]
    slots = state["req_to_token"][rpi[:, None], seq_lens[:, None] + torch.arange(n, device=device)].long()
    vocab = 120
    result = SimpleNamespace(
        next_token_ids=torch.randint(0, vocab, (bs * n,), generator=gen, dtype=torch.int32).to(device),
        logits_output=SimpleNamespace(hidden_states=target_hidden[idx].reshape(bs * n, -1)),
        accept_lens=torch.randint(1, n + 1, (bs,), generator=gen, dtype=torch.int32).to(device),
        next_draft_input=SimpleNamespace())
    batch = SimpleNamespace(seq_lens=seq_lens, req_pool_indices=rpi, out_cache_loc=slots.reshape(-1),
                            forward_mode=fake_sglang.ForwardMode())
    return batch, result


def _recorded_extend(dw):
    """dw.extend_rows wrapped for the CPU stand-in graphs: each replay recomputes from the static inputs as they are
    then (the pool writes included), into the outputs the captured call returned."""
    calls, rows_fn = [], dw.extend_rows

    def recorded(*rows):
        out = rows_fn(*rows)
        calls.append(lambda: [o.copy_(x) for o, x in zip(out, rows_fn(*rows), strict=True)])
        return out

    dw.extend_rows = recorded
    return {"graph": RecordedGraph, "capturing": recording(calls)}


@pytest.mark.parametrize("eagle3", [True, False], ids=["eagle3", "eagle1"])
def test_the_lean_extend_hands_the_next_draft_what_the_fused_extend_makes(device, eagle3):
    """lean_extend: next_draft_input's top-k and hidden state are FusedDrafter.draft_extend's of the verify's next
    tokens, the draft's ``fc`` of its target features (EAGLE-1: the features themselves), the lengths before the
    verify and the accept lengths, its K / V stored at the verify's slots through SGLang's pool with the draft layer's
    scales; replayed from graphs of 1, 2 and 4 requests (3 padded into 4, 5 eager above the largest) and eagerly;
    the scheduler's WAR event recorded after each; counted."""
    n = 4
    graphed = _extend_worker(eagle3, device, n)
    eager = _extend_worker(eagle3, device, n)
    dw, pool, state, target_hidden, fc = graphed
    w_dtype = state["k_cache"].dtype
    if device == "cuda":
        dw.capture_lean_extend({n: [1, 2, 4]}, capturing=lambda g: torch.cuda.graph(g))
    else:
        dw.capture_lean_extend({n: [1, 2, 4]}, **_recorded_extend(dw))
    before = eager[1].k_cache.clone()
    eager[0].compile_lean_extend([1, n])  # what a server without graphs runs before serving: the padding slot only
    assert torch.equal(eager[1].k_cache[1:], before[1:]) and len(eager[1].writes) == 2
    eager[1].writes.clear()
    published = []
    for d, *_ in (graphed, eager):
        d.lean_extend_on, d.publish_read_done = True, lambda d=d: published.append(d)
    for seed, rows in enumerate(([2], [4, 0, 3], [1, 3], [0, 1, 2, 3, 4])):
        outs = []
        for d, p, s, th, _ in (graphed, eager):
            batch, result = _step(s, th, rows, n, seed)
            before = len(p.writes)
            assert d._draft_extend_for_decode(batch, result) is None and not d.draft_stale
            replayed = d is dw and device == "cuda" and len(rows) <= 4  # a CUDA graph writes without calling the pool
            assert len(p.writes) == before + (not replayed)
            for layer, loc, k_scale, v_scale in p.writes[before:]:
                rows_written = batch.out_cache_loc.shape[0]  # a padded graph's extra rows write the padding slot 0
                assert torch.equal(loc[:rows_written], batch.out_cache_loc) and not loc[rows_written:].any()
                assert layer is d._draft_attention and k_scale is v_scale is None
            outs.append(result.next_draft_input)
        # what the graphs stored: the eager extend's K / V at the same slots (the padding slot 0 aside)
        for cache in ("k_cache", "v_cache"):
            got, stored = getattr(graphed[1], cache)[1:].float(), getattr(eager[1], cache)[1:].float()
            assert (got - stored).abs().max() <= HIDDEN_RTOL[w_dtype] * stored.abs().max(), (rows, cache)
        # the fused extend itself, on a fresh copy of the pool as it was before this step
        d, p, s, th, f = eager
        batch, result = _step(s, th, rows, n, seed)
        bs = len(rows)
        carried = (f(result.logits_output.hidden_states) if eagle3 else result.logits_output.hidden_states)
        k_cache, v_cache = p.k_cache.clone(), p.v_cache.clone()

        def store(k, v, k_cache=k_cache, v_cache=v_cache, loc=batch.out_cache_loc):
            k_cache[loc], v_cache[loc] = k, v

        from sgl_eagle_triton.drafter import FusedDrafter
        w = d._drafter_binding[0]
        want = FusedDrafter(w, 1, 3, n, k_cache, v_cache, s["req_to_token"]).draft_extend(
            result.next_token_ids.long().view(bs, n), carried.view(bs, n, -1), batch.seq_lens, result.accept_lens,
            batch.req_pool_indices, store, 1)
        for got in outs:
            assert got.topk_p.shape == (bs, 1) and torch.equal(got.topk_p, want[0]), rows
            # a graph of another batch size may split its kernels otherwise: the hidden state within rounding
            error = (got.hidden_states.float() - want[2].float()).abs().max() / want[2].float().abs().max()
            assert torch.equal(got.topk_index, want[1]) and error <= HIDDEN_RTOL[w.dtype], (rows, error)
    graphs = dw._extend_graphs[n]
    assert (graphs.replays, graphs.eager, graphs.mismatched) == (3, 1, 0)
    assert RAN[worker.LEAN_EXTEND] == 8 and len(published) == 8


def test_the_lean_extend_runs_only_where_asked_for_a_chains_whole_verify(device, monkeypatch):
    """SGLang's draft extend where the lean one is off, for an idle batch, a verify of another width than the
    state's draft tokens or one without hidden states; steps 0's fill-only step keeps its fill (checked first)."""
    dw, pool, state, target_hidden, _ = _extend_worker(True, device, 2)
    stock = []
    monkeypatch.setattr(worker.EagleDraftWorker, "_draft_extend_for_decode",
                        lambda self, batch, result, **kw: stock.append(batch))
    batch, result = _step(state, target_hidden, [0, 1], 2)
    dw._draft_extend_for_decode(batch, result)
    assert len(stock) == 1 and not pool.writes  # off
    dw.lean_extend_on = True
    idle = SimpleNamespace(forward_mode=fake_sglang.ForwardMode(idle=True), seq_lens=batch.seq_lens[:0])
    dw._draft_extend_for_decode(idle, result)
    assert len(stock) == 2
    dw.speculative_num_draft_tokens = 3  # the state's width is not the verify's
    dw._draft_extend_for_decode(batch, result)
    assert len(stock) == 3
    dw.speculative_num_draft_tokens = 2
    result.logits_output.hidden_states = None
    dw._draft_extend_for_decode(batch, result)
    assert len(stock) == 4 and RAN[worker.LEAN_EXTEND] == 0
    filled = []
    monkeypatch.setattr(TritonEagleDraftWorker, "fill_draft_kv", lambda self, b, r: filled.append(b))
    dw.fill_kv_only, dw.speculative_num_steps = True, 0
    dw._draft_extend_for_decode(batch, result)
    assert filled == [batch] and len(stock) == 4 and dw.draft_stale


def _main_worker(dw, states=None):
    w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
    w._draft_worker, w.speculative_num_draft_tokens = dw, 4
    w.adaptive_controller = None if states is None else SimpleNamespace(_states=states)
    w.server_args = SimpleNamespace(disable_cuda_graph=False, tp_size=1, speculative_eagle_topk=1, page_size=1,
                                    kv_cache_dtype="auto")
    w.cost_policy = None
    w._target_worker = SimpleNamespace(model_runner=SimpleNamespace(
        decode_cuda_graph_runner=SimpleNamespace(capture_bs=[2, 1, 16])))
    return w


def test_the_lean_extend_starts_by_default_at_every_states_verify_graph_sizes(monkeypatch, caplog):
    """start_lean_extend: unset (the default) or SGLANG_EAGLE_TRITON_LEAN_EXTEND=1, each draft-token count captured at
    its state's verify graphs' sizes (static: the target's decode graphs), none with CUDA graphs off (eager), the
    scheduler's WAR event handed to the draft worker, the counts without graphs compiled eagerly first; nothing under
    0. Where the server args rule it out, SGLang's extend reads the DSA top-k seeding or a KV canary watches the draft:
    declined, the reason logged and reported by default; refused under 1. Paged and FP8 pools start it."""
    caplog.set_level(logging.INFO)
    captured = []
    compiled = []
    dw = SimpleNamespace(capture_lean_extend=captured.append, compile_lean_extend=compiled.append,
                         lean_extend_on=False, _extend_graphs=None,
                         publish_read_done=None, draft_runner=SimpleNamespace(canary_manager=None),
                         seed_dsa_topk_from_draft_extend=False)
    w = _main_worker(dw)
    monkeypatch.setenv(config.LEAN_EXTEND_ENV, "0")
    w.start_lean_extend()
    assert captured == [] and not dw.lean_extend_on and not w.lean_extend_on
    for value in (None, "1"):
        if value is None:
            monkeypatch.delenv(config.LEAN_EXTEND_ENV, raising=False)
        else:
            monkeypatch.setenv(config.LEAN_EXTEND_ENV, value)
        captured.clear()
        w = _main_worker(dw)
        w.start_lean_extend()
        assert captured == [{4: [1, 2, 16]}] and dw.lean_extend_on and w.lean_extend_on and compiled[-1] == []
        assert dw.publish_read_done == w._publish_read_done and "last accepted row alone" in caplog.text
        assert w.lean_extend_declined is None
    graphs = SimpleNamespace(capture_bs=[2, 1])
    w = _main_worker(dw, {0: SimpleNamespace(speculative_num_draft_tokens=1, target_graph_runner=graphs),
                          3: SimpleNamespace(speculative_num_draft_tokens=4, target_graph_runner=graphs),
                          7: SimpleNamespace(speculative_num_draft_tokens=8, target_graph_runner=None)})
    w.start_lean_extend()
    assert captured[-1] == {1: [1, 2], 4: [1, 2]}  # steps 0's resume extends one row; no graphs at 7: eager
    assert compiled[-1] == [8]
    w.server_args.disable_cuda_graph = True
    w.start_lean_extend()
    assert len(captured) == 2 and w.lean_extend_on and compiled[-1] == [1, 4, 8]  # eager: compiled before serving
    cases = [(dw, "seed_dsa_topk_from_draft_extend", True, "seeds DSA", "WARNING"),
             (dw.draft_runner, "canary_manager", True, "a KV canary", "WARNING"),
             (w.server_args, "tp_size", 2, "--tp 2", "INFO"),
             (w.server_args, "speculative_eagle_topk", 4, "--speculative-eagle-topk 4", "INFO")]
    for value in (None, "1"):
        if value is None:
            monkeypatch.delenv(config.LEAN_EXTEND_ENV, raising=False)
        else:
            monkeypatch.setenv(config.LEAN_EXTEND_ENV, value)
        fp8 = (None, torch.empty(1, dtype=torch.float8_e4m3fn))  # from --kv-cache-dtype fp8_* or a checkpoint's
        for owner, attr, setting, why, level in cases + [(w.server_args, "page_size", 16, None, None),
                                                         (dw, "_drafter_binding", fp8, None, None)]:
            dw.lean_extend_on = False
            w = _main_worker(dw)
            owner = w.server_args if owner is not dw and owner is not dw.draft_runner else owner
            caplog.clear()
            with monkeypatch.context() as patch:
                patch.setattr(owner, attr, setting, raising=False)
                if why is None:  # paged and FP8 pools: served by the default and by =1 (lossless end to end)
                    w.start_lean_extend()
                    assert w.lean_extend_on and w.lean_extend_declined is None
                elif value == "1":
                    with pytest.raises(RuntimeError, match=f"LEAN_EXTEND=1, but .*{why}.*unset SGLANG_EAGLE_TRITON_L"):
                        w.start_lean_extend()
                else:
                    w.start_lean_extend()
                    assert not w.lean_extend_on and not dw.lean_extend_on and why in w.lean_extend_declined
                    record, = [r for r in caplog.records if "the draft extend runs SGLang's" in r.getMessage()]
                    assert record.levelname == level and why in record.getMessage()
                    assert why in w.kernel_report()["kernels"]["draft extend"]


def test_an_ab_of_the_lean_extend_alternates_it(monkeypatch):
    """SGLANG_EAGLE_TRITON_AB_FEATURE=lean_extend: the draft worker's lean extend on and off every AB_STEPS decode
    steps, the cycle timing told the arm; nothing where it did not start."""
    dw = SimpleNamespace(lean_extend_on=True)
    w = _main_worker(dw)
    w._ab_steps, w._ab_count, w._ab_feature = 2, 0, "lean_extend"
    timing = SimpleNamespace(arm=None)
    w.__dict__["_cycle_timing"] = timing
    w.lean_extend_on = True
    seen = []
    for _ in range(6):
        w._next_ab_arm()
        seen.append((dw.lean_extend_on, timing.arm))
    assert seen == [(True, "lean-extend")] * 2 + [(False, "sglang-extend")] * 2 + [(True, "lean-extend")] * 2
    w.lean_extend_on, dw.lean_extend_on, timing.arm = False, False, None
    w._next_ab_arm()
    assert not dw.lean_extend_on and timing.arm is None


def test_the_kernel_report_names_the_lean_extend(monkeypatch):
    w = _main_worker(SimpleNamespace())
    w.lean_extend_on = True
    assert w.kernel_report()["kernels"]["draft extend"].startswith("lean: the draft KV of every verified row")
    w.lean_extend_on = False
    assert "draft extend" not in w.kernel_report()["kernels"]


def test_the_e2e_check_wants_the_lean_extend_where_it_runs_by_default(monkeypatch):
    """tests.e2e.lean_extend_problem: by default and under 1 a chain on one GPU must have run the lean extend
    (counted, named by the report), nothing elsewhere (TP, trees); under 0 nowhere. Can fail: a server that ran none,
    or ran it where it should not."""
    from tests.e2e import lean_extend_problem
    ran = {"ran": {worker.LEAN_EXTEND: 7}, "kernels": {"draft extend": "lean: ..."}}
    none = {"ran": {}, "kernels": {"draft extend": "SGLang's (lean declined: --tp 2 ...)"}}
    monkeypatch.delenv(config.LEAN_EXTEND_ENV, raising=False)
    assert lean_extend_problem(ran) is None and "0 lean draft extends" in lean_extend_problem(none)
    for kw in ({"one_gpu": False}, {"chain": False}):
        assert lean_extend_problem(none, **kw) is None
        assert "where SGLang's draft extend should run" in lean_extend_problem(ran, **kw)
    monkeypatch.setenv(config.LEAN_EXTEND_ENV, "1")
    assert lean_extend_problem(ran) is None and lean_extend_problem(none)
    assert lean_extend_problem(none, chain=False) is None
    monkeypatch.setenv(config.LEAN_EXTEND_ENV, "0")
    assert lean_extend_problem(none) is None and lean_extend_problem(ran) is not None


def test_under_1_the_e2e_servers_the_lean_extend_does_not_serve_take_sglangs(monkeypatch):
    """tests.e2e.lean_extend_env: under SGLANG_EAGLE_TRITON_LEAN_EXTEND=1 exported for the run, a tree or TP server
    (which =1 would refuse) gets =0; chains on one GPU, and every server without =1, keep their environment."""
    from tests.e2e import lean_extend_env
    env = {"X": "1"}
    monkeypatch.setenv(config.LEAN_EXTEND_ENV, "1")
    assert lean_extend_env(env, served=True) is env
    assert lean_extend_env(env, served=False) == {"X": "1", config.LEAN_EXTEND_ENV: "0"} and env == {"X": "1"}
    assert lean_extend_env(None, served=False) == {config.LEAN_EXTEND_ENV: "0"}
    monkeypatch.delenv(config.LEAN_EXTEND_ENV)
    assert lean_extend_env(env, served=False) is env


def test_a_lean_extend_capture_out_of_gpu_memory_declines_by_default_and_is_refused_under_1(monkeypatch):
    """The capture of the lean extend's graphs runs out of GPU memory: by default SGLang's draft extend (its graphs
    are there), the half-captured graphs dropped and the reason reported; under =1 the server is refused."""
    def out_of_memory(sizes):
        dw._extend_graphs = {"partial": sizes}
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    dw = SimpleNamespace(capture_lean_extend=out_of_memory, compile_lean_extend=lambda counts: None,
                         lean_extend_on=False, _extend_graphs=None, publish_read_done=None,
                         draft_runner=SimpleNamespace(canary_manager=None), seed_dsa_topk_from_draft_extend=False)
    workers = []
    check_out_of_memory(monkeypatch, config.LEAN_EXTEND_ENV, lambda: workers.append(_main_worker(dw)),
                        lambda: workers[-1].start_lean_extend(),
                        "LEAN_EXTEND=1, but capturing its graphs ran out of GPU",
                        lambda: not dw.lean_extend_on and not workers[-1].lean_extend_on
                        and "out of GPU memory" in workers[-1].lean_extend_declined,
                        after=lambda: dw._extend_graphs is None and dw.publish_read_done is None)
