"""The cost-aware adaptive policy (sgl_eagle_triton/adaptive.py) on the CPU: its acceptance estimate, its costs, its
decisions and hysteresis, SGLang's AdaptiveController driving it, and the worker timing each state's graphs."""

import math
import random
from types import SimpleNamespace

import pytest
from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController

from sgl_eagle_triton import worker
from sgl_eagle_triton.adaptive import PROBE, REPRICE, CostAwarePolicy, CycleCost, DepthAcceptance, replay_ms
from sgl_eagle_triton.worker import EagleTritonWorkerV2


def chain_verifies(rates, steps, requests, rng):
    """Accepted drafts per request of one verify of a ``steps`` chain whose depth d passes with ``rates[d - 1]``."""
    out = []
    for _ in range(requests):
        k = 0
        while k < steps and rng.random() < rates[k]:
            k += 1
        out.append(k)
    return out


def test_depth_rates_are_estimated_from_censored_chains():
    rates = [0.9, 0.7, 0.5, 0.5, 0.5, 0.5, 0.5]
    est, rng = DepthAcceptance(7, decay=1.0), random.Random(0)
    for _ in range(400):
        est.observe(3, chain_verifies(rates, 3, 8, rng))
    for d in (1, 2, 3):
        assert abs(est.rate(d) - rates[d - 1]) < 0.03, (d, est.rate(d))
    # depths 4..7 were never drafted: they take depth 3's rate, so a 7-step chain is still predicted
    assert est.rate(7) == est.rate(3)
    r = [est.rate(d) for d in range(1, 8)]
    expected = 1 + sum(math.prod(r[:d]) for d in range(1, 8))
    assert est.expected_tokens(7) == pytest.approx(expected)
    assert est.expected_tokens(0) == 1.0


def test_an_unobserved_estimate_is_the_prior_and_forgetting_follows_a_change():
    est = DepthAcceptance(3, prior=(0.6, 4.0), decay=0.9)
    assert est.rate(1) == pytest.approx(0.6) and est.expected_tokens(1) == pytest.approx(1.6)
    for _ in range(60):
        est.observe(1, [1] * 8)  # everything accepted
    assert est.rate(1) > 0.95
    for _ in range(60):
        est.observe(1, [0] * 8)  # then nothing
    assert est.rate(1) < 0.05


COSTS = {  # (steps, batch): graph ms, shaped like the H100 8B sweep: deep chains cheap alone, costly in a crowd
    (0, 1): 7.0, (1, 1): 7.5, (3, 1): 8.5, (7, 1): 10.5,
    (0, 64): 8.0, (1, 64): 11.0, (3, 64): 18.0, (7, 64): 34.0,
}


def test_cycle_cost_pads_to_captured_sizes_and_learns_the_rest_of_the_cycle():
    c = CycleCost(COSTS, alpha=0.5)
    assert c.bucket(1) == 1 and c.bucket(2) == 64 and c.bucket(500) == 64
    assert c.cost(3, 40) == 18.0
    c.observe_cycle(3, 64, 20.0)
    assert c.rest[3, 64] == 2.0 and c.cost(3, 40) == 20.0
    assert c.cost(0, 64) == 8.0 and c.cost(3, 1) == 8.5  # another state, another bucket: graphs alone until tried
    c.observe_cycle(3, 64, 108.0)  # the first samples' lower median: an early pause does not stick
    assert c.rest[3, 64] == 2.0
    c.observe_cycle(3, 64, 22.0)
    assert c.rest[3, 64] == 4.0
    c.observe_cycle(3, 64, 20.0)  # from the fourth sample on, an EMA
    assert c.rest[3, 64] == 3.0
    c.observe_cycle(3, 64, 80.0)  # a prefill fell between the steps: not a cycle
    assert c.rest[3, 64] == 3.0
    c.observe_cycle(0, 64, 9.0)
    assert c.rest[0, 64] == 1.0 and c.rest[3, 64] == 3.0  # each state its own rest
    # the report's spread: the least and largest rests counted (the dropped prefill not among them), how many
    assert c.spread() == {(3, 64): (2.0, 90.0, 4), (0, 64): (1.0, 1.0, 1)}
    # every cycle timed, and those dropped as pauses (the early 108 ms one was counted, inside the first median)
    assert c.timed == {(3, 64): 5, (0, 64): 1} and c.dropped == {(3, 64): 1}
    for _ in range(40):
        c.observe_cycle(3, 64, 21.0)
    assert c.spread()[3, 64] == (3.0, 3.0, 32)  # the last 32
    sparse = CycleCost({(0, 8): 4.0, (3, 8): 6.0, (3, 32): 12.0})
    assert sparse.graphs_ms(0, 32) == 16.0  # steps 0 has no graph at 32: its 8 scaled by the batch


def test_a_drafting_state_is_priced_with_the_least_counted_rest_at_its_bucket_until_its_own_counts():
    """H200 sweeps, batch 64: the 3-step chain's cycle was its graphs + 2.1-2.4 ms; the 7-step chain's rest rested on
    one cycle that measured under its replay (0 ms), and the untried 1-step chain, priced with it at its graphs
    alone, looked best and was tried for nothing (twice). A rest counts from its third cycle; until then a drafting
    state borrows the least counted rest of another drafting state there. (Each state's own rest: without the cap
    by deeper states, tested below.)"""
    c = CycleCost({(0, 64): 5.3, (1, 64): 6.2, (3, 64): 8.1, (7, 64): 14.5, (3, 1): 5.7}, cap_by_deeper=False)
    for wall in (10.4, 10.2, 10.5):
        c.observe_cycle(3, 64, wall)
    c.observe_cycle(7, 64, 14.0)  # one cycle, under its replay: rest 0, not counted
    assert c.counted(3, 64) and not c.counted(7, 64)
    assert c.cost(1, 64) == pytest.approx(6.2 + 2.3)  # the 3-step chain's counted rest, not the 7-step's 0
    assert c.cost(7, 64) == pytest.approx(14.5 + 2.3)  # its own rest not counted yet: borrowed too
    assert c.cost(0, 64) == 5.3  # steps 0 runs no tree work: its graphs alone until tried
    assert c.cost(3, 1) == 5.7  # nothing learnt at batch 1
    for wall in (6.8, 6.7, 6.9):
        c.observe_cycle(1, 64, wall)
    assert c.cost(1, 64) == pytest.approx(6.8)  # its own rest once counted
    assert c.cost(7, 64) == pytest.approx(14.5 + 0.6)  # now the least counted rest there
    lone = CycleCost({(1, 8): 5.0, (3, 8): 6.0}, cap_by_deeper=False)
    lone.observe_cycle(3, 8, 7.0)
    assert lone.cost(3, 8) == 7.0 and lone.cost(1, 8) == 5.0  # nothing counted: its own first samples, or none
    for wall in (5.6, 5.5, 5.7):
        c.observe_cycle(0, 1, wall)  # steps 0 counted at batch 1
    assert c.cost(0, 64) == pytest.approx(5.3 + c.rest[0, 1])  # untried at 64: its own rest at the nearest smaller size
    c.observe_cycle(0, 64, 90.0)  # its one sample at 64, maybe a pause: the smaller size's counted rest still prices it
    assert c.cost(0, 64) == pytest.approx(5.3 + c.rest[0, 1])
    c.observe_cycle(0, 64, 7.0)  # two samples: their lower median
    assert c.cost(0, 64) == pytest.approx(7.0)


def test_a_state_is_priced_no_dearer_than_a_counted_deeper_state():
    """Trained tiny pair, one H200, batch 1: a cost server priced the chain of 3 at 4.9-5.1 ms from its first requests
    and never tried it again while the chain of 7's price fell to 3.8-4.1 ms; tried again (a probe), the chain of 3
    cost 3.2 ms. A state does a subset of a deeper state's work (fewer steps, shorter graphs), so its cycle is priced
    at most the deeper state's counted cycle at that bucket; a shallower state's cycle does not cap a deeper one's."""
    replay = {(0, 1): 0.13, (1, 1): 0.17, (3, 1): 0.23, (5, 1): 0.29, (7, 1): 0.34, (7, 16): 0.34}
    c = CycleCost(replay)
    for wall in (5.0, 5.1, 5.2):
        c.observe_cycle(3, 1, wall)
    assert c.cost(3, 1) == pytest.approx(5.1)
    for wall in (4.0, 3.9, 4.1):
        c.observe_cycle(7, 1, wall)
    assert c.cost(7, 1) == pytest.approx(4.0)
    assert c.cost(3, 1) == pytest.approx(4.0)  # capped by the chain of 7's cycle
    assert c.rest[3, 1] == pytest.approx(4.87)  # its own rest is kept: the cap is a price, not a sample
    assert c.cost(5, 1) == pytest.approx(0.29 + 3.66)  # uncounted: the least counted rest, below 7's cycle
    for wall in (1.9, 2.0, 2.1):
        c.observe_cycle(0, 1, wall)
    assert c.cost(0, 1) == pytest.approx(2.0)  # steps 0's own cycle, below every drafting state's
    for wall in (2.5, 2.5, 2.5):
        c.observe_cycle(1, 1, wall)
    assert c.cost(7, 1) == pytest.approx(4.0)  # a shallower state's cycle never caps a deeper one's
    for wall in (1.5, 1.5, 1.5):
        c.observe_cycle(7, 16, wall)
    assert c.cost(3, 1) == pytest.approx(4.0)  # another bucket's cycle caps nothing here
    noisy = CycleCost({(3, 1): 0.35, (7, 1): 0.34})  # replays within their noise: the shallower measured longer
    for wall in (2.5, 2.5, 2.5):
        noisy.observe_cycle(3, 1, wall)
    for wall in (4.0, 4.0, 4.0):
        noisy.observe_cycle(7, 1, wall)
    assert noisy.cost(7, 1) == pytest.approx(4.0)  # still not capped by a state of fewer steps
    wide = CycleCost({(3, 1): 0.40, (4, 1): 0.30})  # a wide tree of 3 steps beside a chain of 4 (shorter graphs)
    for wall in (3.0, 3.0, 3.0):
        wide.observe_cycle(3, 1, wall)
    for wall in (2.0, 2.0, 2.0):
        wide.observe_cycle(4, 1, wall)
    assert wide.cost(3, 1) == pytest.approx(3.0)  # the chain does not do the tree's work: no cap
    once = CycleCost(replay)
    for wall in (5.0, 5.0, 5.0):
        once.observe_cycle(3, 1, wall)
    once.observe_cycle(7, 1, 0.2)  # one cycle under its replay (rest 0): not counted, caps nothing
    assert once.cost(3, 1) == pytest.approx(5.0)
    slow7 = CycleCost(replay)
    for wall in (6.0, 6.0, 6.0):
        slow7.observe_cycle(7, 1, wall)
    for wall in (3.3, 3.2, 3.1):
        slow7.observe_cycle(3, 1, wall)
    assert slow7.cost(3, 1) == pytest.approx(3.2)  # its own cycle where that is the lower
    own = CycleCost(replay, cap_by_deeper=False)  # the A/B switch: own rests alone
    for steps, wall in ((3, 5.0), (7, 4.0)):
        for _ in range(3):
            own.observe_cycle(steps, 1, wall)
    assert own.cost(3, 1) == pytest.approx(5.0)


def test_a_new_batch_size_is_decided_at_once_not_after_the_next_verifies():
    """The sweep's rounds: a chain of 7 chosen alone at batch 1 stayed in force for the first verifies of a batch of
    64 (about 10 cycles of 14.6 ms instead of 8 ms). The first decode step at another captured size decides."""
    policy, verify = make_policy([0.9] * 7, update_interval=8)
    for _ in range(100):
        policy.get_steps_for_batch(1)
        verify(1)
    assert policy.current == 7
    assert policy.get_steps_for_batch(64) == 7  # one step at 64: the batch may only be passing
    assert policy.get_steps_for_batch(64) == 3  # the second: decided, before any verify at 64
    assert policy.get_steps_for_batch(40) == 3 and policy.switches == 2  # same bucket: no new decision
    assert policy.get_steps_for_batch(1) == 3 and policy.get_steps_for_batch(1) == 3  # no verify counted since
    for _ in range(8):
        verify(1)
    assert policy.get_steps_for_batch(1) == 7


# H200 sweeps of 2026-11-27 (8B shapes, our verify attention), from the cost policy's start-up log: graph replay
# ms per (steps, batch); the rest of the cycle (cycle minus replay) as learnt at 32 and 64 (the 7-step chain's at 64
# set to 3 ms: its learnt 0.07 rested on one cycle), 0.5 ms at the small sizes
H200_REPLAY = {
    (0, 1): 4.612, (0, 4): 4.634, (0, 8): 4.675, (0, 16): 4.794, (0, 32): 4.912, (0, 64): 5.211,
    (1, 1): 5.033, (1, 4): 5.109, (1, 8): 5.187, (1, 16): 5.32, (1, 32): 5.529, (1, 64): 6.115,
    (3, 1): 5.656, (3, 4): 5.756, (3, 8): 5.865, (3, 16): 6.096, (3, 32): 6.608, (3, 64): 8.098,
    (7, 1): 6.947, (7, 4): 7.123, (7, 8): 7.265, (7, 16): 7.618, (7, 32): 9.661, (7, 64): 14.64}
H200_REST = {**{bs: dict.fromkeys((0, 1, 3, 7), 0.5) for bs in (1, 4, 8, 16)},
             32: {0: 0.5, 1: 0.6, 3: 0.91, 7: 1.125}, 64: {0: 0.6, 1: 0.68, 3: 2.4, 7: 3.0}}
# chain depth rates: 3 steps commit 3.07 tokens, 7 steps 4.06 (the log's estimates: 3.0, 4.0)
SWEEP_RATES = [0.85, 0.8, 0.8, 0.75, 0.7, 0.65, 0.6]
PREFILL_MS = 20.0


def sweep_rounds(batch: int, seed: int) -> tuple[list[int], list[list[int]]]:
    """bench.adaptive's pattern at one batch size, three times over: a lone warm-up request (the policy drafts deep),
    then two rounds of ``batch`` requests decoding together, each ending in a tail where requests finish one after
    another and the policy, rightly, drafts deep again (the 2026-11-27 sweep's log: 3 -> 7 at batch 11, 12, 13) a few
    verifies before the next round's prefill. Returns the step counts the lone requests ran and each round's."""
    now, rng = [0.0], random.Random(seed)
    policy = CostAwarePolicy([0, 1, 3, 7], 3, clock=lambda: now[0])
    policy.set_costs(CycleCost(H200_REPLAY))

    def run(sizes):
        """SGLang's overlap scheduling: step j + 1 is launched (``get_steps_for_batch``) once step j - 1's results
        are in, and step j's verify is fed after step j + 1's launch."""
        policy.forget_last_step()  # the prefill before it (EagleTritonWorkerV2.forward_batch_generation)
        ran, gpu_ms, verifies = [], [PREFILL_MS], []
        for bs in sizes:
            now[0] += (gpu_ms[-2] if len(gpu_ms) > 1 else 0.0) / 1e3
            ran.append(policy.get_steps_for_batch(bs))
            bucket = policy.costs.bucket(bs)
            gpu_ms.append(H200_REPLAY[ran[-1], bucket] + H200_REST[bucket][ran[-1]])
            if verifies:
                policy.on_verify_complete(*verifies.pop())
            verifies.append((chain_verifies(SWEEP_RATES, ran[-1], bs, rng), bs))
        now[0] += sum(gpu_ms[-2:]) / 1e3
        policy.on_verify_complete(*verifies.pop())
        return ran

    drain = [batch - 4] * 3 + [12, 12, 11, 6, 1]
    alone, rounds = [], []
    for _ in range(3):
        alone += run([1] * 60)
        for _ in range(2):
            rounds.append(run([batch] * 80))
            run(drain)
    return alone, rounds


@pytest.mark.parametrize("batch", [32, 64])
def test_the_sweeps_rounds_run_the_best_chain_after_a_lone_request_and_a_draining_batch(batch):
    """Under the H200 sweep's costs the 3-step chain is best at 32 and 64, the 7-step chain alone. The first H200
    sweep ran 7 steps through the first verifies of every batch (0.80x our static 3-step chain at 64); the second
    waited for the tail's switch to be 8 verifies old (0.97x at 32); the third decided at the
    round's second cycle but kept the tail's 7 steps whenever its estimates put the two within the 5 % margin (0.91x
    at 32). A batch-size decision now takes no margin: the state in force was chosen for another size. Over 10
    seeds (60 rounds, overlap scheduling): no round starts with more than ``settle + 1`` cycles of 7 steps (3-6 of 60 at
    32 with the margin); leading cycles of 7 steps 0.98 / 1.0 a round (the first cycle at the new size)."""
    leading, ran, deep_alone = [], [], True
    for seed in range(10):
        alone, rounds = sweep_rounds(batch, seed)
        deep_alone &= 7 in alone
        leading += [next((i for i, s in enumerate(r) if s != 7), len(r)) for r in rounds]
        ran += [s for r in rounds for s in r]
    assert deep_alone and sum(leading) >= len(leading) / 2, leading  # rounds do start from the tail's 7 steps
    assert not any(lead > CostAwarePolicy([3], 3).settle + 1 for lead in leading), leading
    assert sum(leading) <= 1.1 * len(leading), leading
    assert ran.count(3) >= 0.97 * len(ran), {s: ran.count(s) for s in set(ran)}


def test_a_batch_hovering_at_a_size_boundary_does_not_switch_at_every_step():
    """A batch alternating between two captured sizes: a bucket decision needs the new size held two steps, so only
    the regular decisions run, every 8 verifies, at one parity; deciding at every change would switch at every step
    and never leave the settle window."""
    costs = {(1, 8): 5.0, (3, 8): 6.0, (1, 16): 5.0, (3, 16): 12.0}  # 3 best at 8, 1 best at 16
    policy = CostAwarePolicy([1, 3], 3, update_interval=8, settle=2, reprice=None)  # re-pricing: its own tests
    policy.set_costs(CycleCost(costs))
    rng = random.Random(2)
    for step in range(400):
        bs = 8 + step % 2
        policy.get_steps_for_batch(bs)
        policy.on_verify_complete(chain_verifies([0.8] * 3, policy.current, bs, rng), bs)
    assert policy.switches <= 2 and policy._verifies > 300
    # held for 2 or 3 steps at a time, each size decides: a switch at most every settle + 1 verifies, each leaving
    # the acceptance model a counted verify (in 400 steps: 65 switches and 268 verifies counted held 2 steps, 130 and
    # 138 held 3; each a pointer swap between chains, a resume step when leaving steps 0)
    for period in (2, 3):
        policy = CostAwarePolicy([1, 3], 3, update_interval=8, settle=2, reprice=None)  # re-pricing: its own tests
        policy.set_costs(CycleCost(costs))
        for step in range(400):
            bs = 8 + (step // period) % 2
            policy.get_steps_for_batch(bs)
            policy.on_verify_complete(chain_verifies([0.8] * 3, policy.current, bs, rng), bs)
        assert policy.switches <= 400 / (policy.settle + 1) and policy._verifies >= policy.switches, period


def test_no_decision_before_any_verify():
    """At start the acceptance is the prior's: a batch-size change decides only after ``update_interval`` verifies."""
    policy = CostAwarePolicy([0, 1, 3, 7], 3)
    policy.set_costs(CycleCost(COSTS))
    assert policy.get_steps_for_batch(1) == 3 and policy.get_steps_for_batch(64) == 3 and policy.switches == 0


def make_policy(rates, initial=3, **kw):
    policy = CostAwarePolicy([0, 1, 3, 7], initial, **kw)
    policy.set_costs(CycleCost(COSTS))
    rng = random.Random(1)
    return policy, lambda bs: policy.on_verify_complete(chain_verifies(rates, policy.current, bs, rng), bs)


def test_high_acceptance_drafts_deep_alone_and_shallow_in_a_crowd():
    rates = [0.9] * 7
    policy, verify = make_policy(rates)
    for _ in range(200):
        verify(1)
    assert policy.current == 7
    for _ in range(200):
        verify(64)
    assert policy.current in (1, 3)  # values at 64: 1.9/11, 3.4/18, 5.3/34 per ms: 3 best, 1 next
    assert policy.best(64) == 3 and policy.switches >= 2


def test_low_acceptance_turns_speculation_off_when_it_costs_more_than_it_commits():
    policy, verify = make_policy([0.05] * 7)
    for _ in range(300):
        verify(64)
    assert policy.current == 0


def test_a_state_whose_rest_is_unknown_is_tried_then_priced_by_its_own_rest():
    """Measured on an H200 (8B shapes, batch 64): a chain's cycle was its graphs + 8 ms, while steps 0 costs about
    its graphs + 1 ms. With one rest shared by every state the chain's 8 ms was charged to steps 0 as well and the
    policy kept the chain (0.87x no-spec); per state, steps 0 is tried and kept."""
    now = [0.0]
    policy = CostAwarePolicy([0, 3], 3, update_interval=1, settle=0, clock=lambda: now[0])
    policy.expected_tokens = {0: 1.0, 3: 2.8}.get
    policy.set_costs(CycleCost({(0, 64): 5.3, (3, 64): 13.5}))
    rest = {0: 1.0, 3: 8.0}

    def cycle():
        policy.get_steps_for_batch(64)
        now[0] += (policy.costs.graphs_ms(policy.current, 64) + rest[policy.current]) / 1e3

    for _ in range(4):
        cycle()
    assert policy.current == 3 and policy.costs.rest[3, 64] == pytest.approx(8.0)
    assert policy.on_verify_complete([2] * 64, 64) == 0  # 1 / 5.3 (rest unknown) beats 2.8 / 21.5
    for _ in range(4):
        cycle()
        assert policy.on_verify_complete([0] * 64, 64) is None  # 1 / 6.3 still beats 2.8 / 21.5: kept
    assert policy.current == 0 and policy.costs.rest[0, 64] == pytest.approx(1.0)


def test_tensor_parallel_ranks_adopt_rank_zeros_choice():
    """Two ranks see the same verifies but time different cycles (rank 1's steps-0 cycles slower): alone they would
    run different shapes; agreeing through rank 0 (what ``worker.rank_zero_decides`` broadcasts) they switch
    together, at the same verify, to rank 0's choice."""
    def ranks(agreed: bool):
        policies, decided = [], []
        for rank in range(2):
            def agree(steps, rank=rank):
                if rank == 0:
                    decided.append(steps)
                    return steps
                return decided[-1]
            policy = CostAwarePolicy([0, 3], 3, update_interval=1, settle=0, agree=agree if agreed else None)
            policy.expected_tokens = {0: 1.0, 3: 2.8}.get
            policy.set_costs(CycleCost({(0, 64): 4.0 if rank == 0 else 12.0, (3, 64): 13.5}))
            policies.append(policy)
        switched = [[p.on_verify_complete([2] * 64, 64) for p in policies] for _ in range(5)]
        return [p.current for p in policies], switched

    assert ranks(agreed=False)[0] == [0, 3]  # without agreement the ranks part ways
    current, switched = ranks(agreed=True)
    assert current == [0, 0] and switched[0] == [0, 0] and all(s == [None, None] for s in switched[1:])


def test_tensor_parallel_ranks_agree_at_a_batch_size_change_too():
    """The decision at a new batch size goes through ``agree`` like the others: every rank sees the same batch sizes,
    so every rank calls it at the same decode step."""
    calls, rank_zero = [], [3]
    policy = CostAwarePolicy([0, 3], 3, update_interval=1, settle=0,
                             agree=lambda steps: calls.append(steps) or rank_zero[0])
    policy.expected_tokens = {0: 1.0, 3: 2.8}.get
    policy.set_costs(CycleCost({(0, 1): 4.0, (3, 1): 6.0, (0, 64): 5.0, (3, 64): 13.5}))
    assert policy.get_steps_for_batch(1) == 3 and calls == []  # the first step: nothing to change from
    assert policy.on_verify_complete([2], 1) is None and calls == [3]  # a regular decision: 3 kept
    rank_zero[0] = 0
    assert policy.get_steps_for_batch(64) == 3 and calls == [3]  # the first step at 64: no decision yet
    assert policy.get_steps_for_batch(64) == 0 and calls == [3, 3]  # this rank would keep 3 (2.8 / 13.5 > 1 / 5)


def test_hysteresis_keeps_a_near_tie_and_settles_after_a_switch(monkeypatch):
    policy = CostAwarePolicy([1, 3], 1, update_interval=1, settle=2, margin=0.05)
    monkeypatch.setattr(policy.acceptance, "expected_tokens", {1: 2.0, 3: 3.0}.get)
    policy.set_costs(CycleCost({(1, 1): 10.0, (3, 1): 15.0 / 1.03}))  # 3 is worth 3 % more: no switch
    for _ in range(50):
        policy.on_verify_complete([1], 1)
    assert policy.current == 1 and policy.switches == 0
    policy.set_costs(CycleCost({(1, 1): 10.0, (3, 1): 15.0 / 1.10}))
    assert policy.on_verify_complete([1], 1) == 3  # 10 % more: switch
    before = policy.acceptance.tried[:]
    assert policy.on_verify_complete([0], 1) is None and policy.on_verify_complete([0], 1) is None
    assert policy.acceptance.tried == before  # the two verifies after the switch were ignored


def test_under_overlap_scheduling_a_cycle_is_timed_to_the_state_that_ran_it():
    """SGLang's overlap scheduler launches step j + 1 once step j - 1's results are in, so the time between two
    decode steps' calls is the GPU time of the step before the first. The H200 sweep of 2026-11-27 (batch 32) timed
    it to the state in force at the first call: after each switch the deeper chain got the shallower one's cycle
    (rest 0), and then dropped every true sample as a pause; it stayed in force at 0.91x our static 3-step chain."""
    now, truth = [0.0], {3: H200_REST[32][3], 7: H200_REST[32][7]}
    policy = CostAwarePolicy([3, 7], 3, update_interval=10**9, clock=lambda: now[0])
    policy.set_costs(CycleCost(H200_REPLAY))
    gpu_ms = []
    for i in range(200):
        policy.current = 3 if (i // 5) % 2 == 0 else 7  # the state changes every 5 steps (the cycle knob's way)
        now[0] += (gpu_ms[-2] if len(gpu_ms) > 1 else 0.0) / 1e3
        gpu_ms.append(H200_REPLAY[policy.get_steps_for_batch(32), 32] + truth[policy.current])
    for steps in (3, 7):
        assert policy.costs.counted(steps, 32)
        assert policy.costs.rest[steps, 32] == pytest.approx(truth[steps], abs=1e-6)


def test_a_rest_first_measured_low_still_learns_its_true_value():
    """A rest whose first samples were 0 (a wrongly timed cycle) must not drop every later sample above 1 ms as a
    pause: samples are dropped at over 3x the expected whole cycle."""
    c = CycleCost(H200_REPLAY, alpha=0.5)
    for _ in range(3):
        c.observe_cycle(7, 32, H200_REPLAY[7, 32])
    assert c.counted(7, 32) and c.rest[7, 32] == 0.0
    for _ in range(20):
        c.observe_cycle(7, 32, H200_REPLAY[7, 32] + 2.0)
    assert c.rest[7, 32] == pytest.approx(2.0, abs=1e-3)
    c.observe_cycle(7, 32, 3 * (H200_REPLAY[7, 32] + 2.0) + 2.0)  # a prefill between the two steps
    assert c.rest[7, 32] == pytest.approx(2.0, abs=1e-3)


def test_the_cycle_after_a_dropped_pause_is_not_timed_either():
    """Under overlap scheduling the GPU drains during a host pause: the interval after the dropped one is host time
    alone (here 1 ms against 10 ms cycles) and would pull the rest down."""
    now = [0.0]
    policy = CostAwarePolicy([3], 3, clock=lambda: now[0])
    policy.set_costs(CycleCost({(3, 8): 8.0}))
    for wall in [10.0] * 6 + [100.0, 1.0] + [10.0] * 3:
        policy.get_steps_for_batch(8)
        now[0] += wall / 1e3
    policy.get_steps_for_batch(8)
    assert policy.costs.rest[3, 8] == pytest.approx(2.0)


def test_a_batch_alternating_between_sizes_keeps_a_near_tie_it_chose_there():
    """A batch alternating between sizes 32 and 64 where the 3- and 7-step chains are within 0.2 % at 32 and the
    3-step chain is best at 64: the 3-step chain, chosen or kept at both sizes, stays (a batch-size decision takes
    the margin where the state in force was chosen or kept). Dropping the margin at every batch-size decision
    flapped 7 / 3 at every alternation (a helper's replay of the bench costs: 342-834 switches in 2000 steps, 0.5 %
    fewer tokens per ms than with the margin)."""
    policy = CostAwarePolicy([3, 7], 3, clock=lambda: 0.0)
    policy.expected_tokens = {3: 3.07, 7: 4.06}.get
    policy.set_costs(CycleCost({(3, 32): 7.5, (7, 32): 9.9, (3, 64): 8.1, (7, 64): 14.6}))
    for step in range(400):
        bs = 32 if (step // 4) % 2 == 0 else 40
        policy.get_steps_for_batch(bs)
        policy.on_verify_complete([2] * bs, bs)
    assert policy.current == 3 and policy.switches == 0


def test_the_decode_clock_feeds_the_cost_of_the_state_in_force():
    now = [0.0]
    policy = CostAwarePolicy([0, 3], 3, clock=lambda: now[0])
    policy.set_costs(CycleCost({(0, 8): 5.0, (3, 8): 9.0}))
    for _ in range(5):
        assert policy.get_steps_for_batch(8) == 3
        now[0] += 0.012  # 12 ms cycles: 3 ms outside the graphs
    assert policy.costs.rest[3, 8] == pytest.approx(3.0)
    policy.get_steps_for_batch(4)  # another batch size: no sample across the change
    now[0] += 0.5
    policy.get_steps_for_batch(8)
    assert policy.costs.rest[3, 8] == pytest.approx(3.0) and (0, 8) not in policy.costs.rest


class FakeWorker:
    """SGLang's AdaptiveSpecWorker protocol: records the states built and applied."""

    def __init__(self, steps):
        self.speculative_num_steps, self.built, self.applied = steps, [], []

    def build_adaptive_runtime_state(self, speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs=None):
        self.built.append((speculative_num_steps, cuda_graph_bs))
        return SimpleNamespace(speculative_num_steps=speculative_num_steps,
                               speculative_num_draft_tokens=speculative_num_draft_tokens)

    def apply_runtime_state(self, state):
        self.speculative_num_steps = state.speculative_num_steps
        self.applied.append(state.speculative_num_steps)


def test_sglangs_controller_drives_the_policy():
    fake = FakeWorker(3)
    controller = AdaptiveController.__new__(AdaptiveController)  # SGLang's own methods, our params
    controller.worker, controller._states = fake, {}
    controller.params = policy = CostAwarePolicy([0, 1, 3, 7], 3, update_interval=1, settle=0)
    controller.init_states(cuda_graph_bs=[64, 1])
    assert sorted(fake.built) == [(0, [1, 64]), (1, [1, 64]), (3, [1, 64]), (7, [1, 64])]  # graphs everywhere
    policy.set_costs(CycleCost(COSTS))
    controller.activate_step_by_batch(64)
    assert fake.speculative_num_steps == 3
    for _ in range(40):
        controller.on_verify_complete([0] * 64, batch_size=64)
    assert fake.speculative_num_steps == 0 and fake.applied[-1] == 0


def test_replay_ms_times_each_runners_graph_at_each_size():
    class Runner:
        def __init__(self, sizes):
            self.backend = SimpleNamespace(_graphs={("key", s): f"g{s}" for s in sizes})

        def _make_graph_key(self, size):
            return ("key", size)

    measured = []
    out = replay_ms([Runner([1, 8]), None, Runner([8 * 4])], [1, 8, 16], 4,
                    measure=lambda graphs: measured.append(graphs) or float(len(graphs)))
    # the target's verify graph keyed by tokens (ragged verify mode): 8 requests x 4 tokens
    assert out == {1: 1.0, 8: 2.0} and measured == [["g1"], ["g8", "g32"]]


def test_worker_prices_every_state_after_sglang_builds_them(monkeypatch):
    w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
    states = {s: SimpleNamespace(speculative_num_draft_tokens=s + 1, cuda_graph_runner=f"d{s}",
                                 target_graph_runner=f"t{s}", cuda_graph_runner_for_draft_extend=f"e{s}")
              for s in (0, 3)}
    w.adaptive_controller = SimpleNamespace(_states=states)
    w.cost_policy = CostAwarePolicy([0, 3], 3)
    w.cost_policy.set_cuda_graph_bs([1, 8])
    monkeypatch.setattr(worker.EAGLEWorkerV2, "init_cuda_graphs", lambda self: None)
    compiled = []  # what it compiles: tests/test_compile_before_serving.py
    monkeypatch.setattr(worker.EagleTritonWorkerV2, "compile_eager_kernels", lambda self: compiled.append(self))
    monkeypatch.setattr(worker.EagleTritonWorkerV2, "capture_draft_kv", lambda self: compiled.append("fill graphs"))
    monkeypatch.setattr(worker.EagleTritonWorkerV2, "start_lean_draft", lambda self: compiled.append("lean draft"))
    monkeypatch.setattr(worker.EagleTritonWorkerV2, "start_lean_extend", lambda self: compiled.append("lean extend"))
    w._draft_worker = SimpleNamespace(_fill_graphs="f0")  # steps 0's KV fill graphs (capture_draft_kv)
    seen = []
    monkeypatch.setattr(worker, "replay_ms", lambda runners, sizes, n: seen.append((runners, n)) or
                        {bs: float(n * bs) for bs in sizes})
    w.init_cuda_graphs()
    # steps 0 fills the draft KV instead of replaying its draft-extend graph: its verify and fill graphs are priced
    assert seen == [(("t0", "f0"), 1), (("d3", "t3", "e3"), 4)]
    assert compiled == [w, "fill graphs", "lean draft", "lean extend"]
    assert w.cost_policy.costs.replay == {(0, 1): 1.0, (0, 8): 8.0, (3, 1): 4.0, (3, 8): 32.0}
    # without --cuda-graph-bs-decode SGLang hands the controller no sizes: those of each state's verify graphs
    w.cost_policy = CostAwarePolicy([0, 3], 3)
    w.cost_policy.set_cuda_graph_bs(None)
    for state in states.values():
        state.target_graph_runner = SimpleNamespace(capture_bs=[2, 1, 4])
    seen.clear()
    monkeypatch.setattr(worker, "replay_ms", lambda runners, sizes, n: seen.append(sizes) or {bs: 1.0 for bs in sizes})
    w.init_cuda_graphs()
    assert seen == [[1, 2, 4], [1, 2, 4]] and sorted(w.cost_policy.costs.replay) == [
        (0, 1), (0, 2), (0, 4), (3, 1), (3, 2), (3, 4)]
    monkeypatch.setattr(worker, "replay_ms", lambda runners, sizes, n: {} if n == 4 else {1: 1.0})
    with pytest.raises(RuntimeError, match=r"no CUDA graph to time for steps \[3\]"):
        w.init_cuda_graphs()
    # under the lean draft phase (the default where it can run) a drafting state's draft graphs are our drafter's
    w._draft_worker = SimpleNamespace(_fill_graphs="f0", lean=True, _lean_graphs={(1, 3, 4): "L3"},
                                      drafter_shape=lambda steps: (1, steps, steps + 1))
    w.lean_draft_on = True  # as start_lean_draft leaves it
    seen.clear()
    monkeypatch.setattr(worker, "replay_ms", lambda runners, sizes, n: seen.append(runners) or {1: 1.0})
    w.init_cuda_graphs()
    assert seen == [(states[0].target_graph_runner, "f0"), ("L3", states[3].target_graph_runner, "e3")]
    # under the lean draft extend (the default where it can run) a drafting state's extend graphs are ours
    w._draft_worker._extend_graphs, w.lean_extend_on = {4: "X4"}, True  # as start_lean_extend leaves them
    seen.clear()
    w.init_cuda_graphs()
    assert seen == [(states[0].target_graph_runner, "f0"), ("L3", states[3].target_graph_runner, "X4")]


def test_the_cost_policy_over_trees_counts_every_verify_on_the_device(device, monkeypatch):
    """topk > 1: the worker's cost policy predicts each candidate's tree, and its eagle_sample adds what each verify
    accepted to the policy's device counts (chains: SGLang's accept counts alone, eagle_sample untouched)."""
    import torch

    from sgl_eagle_triton import verify
    from tests.sglang_compat import adaptive_trees

    w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
    w.adaptive_controller = SimpleNamespace(params=SimpleNamespace(candidate_steps=[0, 1, 3]))
    w.server_args = SimpleNamespace(speculative_eagle_topk=4)  # the config file's draft tokens, as read at start
    adaptive_trees(monkeypatch, {0: (4, 1), 1: (4, 2), 3: (4, 6)})
    w.topk, w.speculative_num_steps, w.device, w._eagle_sample = 4, 3, device, verify.eagle_sample
    accepted = (torch.zeros(1, dtype=torch.int32, device=device), torch.tensor([2], dtype=torch.int32, device=device),
                torch.tensor([[0, 1, -1, -1]], dtype=torch.int32, device=device))
    w._eagle_sample = lambda *args: accepted  # stands in for ours: one request accepted node 1
    policy = w._make_cost_policy()
    assert policy.trees == {1: (4, 2), 3: (4, 6)} and policy.evidence is not None
    tree = SimpleNamespace(retrieve_next_token=torch.tensor([[1, -1, -1]], device=device),
                           retrieve_next_sibling=torch.tensor([[-1, 2, -1]], device=device),
                           retrieve_index=torch.arange(3, device=device).view(1, 3))
    batch = SimpleNamespace(forward_mode=SimpleNamespace(is_idle=lambda: False))
    assert w._eagle_sample(tree, batch, None) == accepted
    assert policy.evidence.tables[0, 1].tolist() == [1.0, 1.0, 0.0, 0.0]  # root's children, ranks 0 and 1 tried
    assert policy.evidence.tables[1, 1].tolist() == [1.0, 0.0, 0.0, 0.0]  # rank 0 accepted
    w.topk, w._eagle_sample = 1, verify.eagle_sample
    chains = w._make_cost_policy()
    assert chains.trees is None and w._eagle_sample is verify.eagle_sample


HOST_BOUND = {(0, 1): 2.0, (1, 1): 3.0, (3, 1): 3.2, (7, 1): 3.6}  # graph ms shaped like the tiny pair's cycles


def off_policy(probe, rates):
    """A policy put at steps 0 by useless drafts at batch 1 (host-bound costs), then fed ``rates`` (its ``verify()``:
    one verify of the state in force)."""
    policy, verify = make_policy([0.02] * 7, probe=probe)
    policy.set_costs(CycleCost(HOST_BOUND))
    for _ in range(100):
        verify(1)
        if policy.current == 0:
            break
    assert policy.current == 0 and policy.probes == 0
    rng = random.Random(3)
    return policy, lambda: policy.on_verify_complete(chain_verifies(rates, policy.current, 1, rng), 1)


def test_steps_0_probes_drafting_again_when_the_traffic_turns_easy():
    """At steps 0 no draft is verified, so without a probe an estimate learnt on hard requests holds for the easy ones
    that follow (bench.policy_sim: 3990 of 4000 steps at 0); with it the policy drafts again within the first wait."""
    easy = [0.9] * 7
    held, verify = off_policy(None, easy)
    for _ in range(2000):
        verify()
    assert held.current == 0 and held.probes == 0
    policy, verify = off_policy(PROBE, easy)
    for _ in range(PROBE[0] + PROBE[1]):
        verify()
    assert policy.probes == 1 and policy.current == 7  # the probe kept drafting; its wait starts over
    assert policy._probe_every == PROBE[0]


def test_steps_0_probes_back_off_while_drafting_does_not_pay():
    """On useless drafts every probe returns to steps 0 and the wait before the next doubles up to its longest: a
    probe costs a resume step and ``settle + PROBE[2]`` drafting verifies, so the share of steps spent probing stays
    small (36 of 4000 verifies here)."""
    policy, verify = off_policy(PROBE, [0.02] * 7)
    probes_at, drafting = [], 0
    for i in range(4000):
        before = policy.probes
        verify()
        drafting += policy.current != 0
        if policy.probes != before:
            probes_at.append(i)
    waits = [b - a for a, b in zip(probes_at, probes_at[1:], strict=False)]
    assert len(probes_at) == 6 and policy.current == 0, probes_at
    assert PROBE[0] <= probes_at[0] < PROBE[0] + policy.update_interval, probes_at
    # each wait: the doubled one (up to the longest), plus the probe's own verifies, plus up to one decision interval
    own = policy.settle + PROBE[2]
    expected = [min(2 ** (i + 1) * PROBE[0], PROBE[1]) + own for i in range(len(waits))]
    assert all(0 <= w - e < policy.update_interval for w, e in zip(waits, expected, strict=True)), (waits, expected)
    assert drafting <= len(probes_at) * own, drafting


def test_a_probe_goes_through_the_ranks_agreement():
    """Under tensor parallelism the probe's state is rank 0's choice too (every rank counts the same verifies, so
    every rank probes at the same one)."""
    calls = []
    policy, verify = make_policy([0.02] * 7, probe=PROBE, agree=lambda steps: calls.append(steps) or steps)
    policy.set_costs(CycleCost(HOST_BOUND))
    for _ in range(PROBE[0] + 100):
        verify(1)
    assert policy.probes == 1 and calls.count(0) >= PROBE[0] // policy.update_interval
    assert any(steps > 0 for steps in calls[-20:])


def test_a_probe_that_drafts_a_little_longer_then_returns_still_doubles_the_wait():
    """On a server (one H200, the tiny pair) probes kept drafting at their first decision, the prior pulling the aged
    estimate up, and went back to steps 0 at the next regular one: a return to steps 0 within a probe's first
    decisions doubles the wait (it was reset, and the server probed every 64 verifies); a return after drafting held
    longer starts the first wait again."""
    worth = {0: 1.0, 7: 1.0}
    policy = CostAwarePolicy([0, 7], 0, update_interval=8, settle=2, probe=PROBE)
    policy.set_costs(CycleCost({(0, 1): 1.0, (7, 1): 1.0}))
    policy.expected_tokens = worth.get
    worth[7] = 0.5
    while policy.probes == 0:
        policy.on_verify_complete([0], 1)
    worth[7] = 2.0  # the probe's first decision keeps drafting
    for _ in range(policy.settle + PROBE[2]):
        policy.on_verify_complete([0], 1)
    assert policy.current == 7 and policy._probe_every == PROBE[0]
    worth[7] = 0.5  # the next regular decision goes back
    while policy.current == 7:
        policy.on_verify_complete([0], 1)
    assert policy._probe_every == 2 * PROBE[0]
    while policy.probes == 1:
        policy.on_verify_complete([0], 1)
    worth[7] = 2.0  # this time drafting holds for a while
    for _ in range(policy.settle + PROBE[2] + 4 * policy.update_interval):
        policy.on_verify_complete([0], 1)
    worth[7] = 0.5
    while policy.current == 7:
        policy.on_verify_complete([0], 1)
    assert policy._probe_every == PROBE[0]


def stale_price_server(reprice, worth, cycles_ms, early=(30, 3.8), replay=None):
    """A batch-1 policy over chains of 3 and 7 (host-bound graphs shaped like the tiny pair's) with expected tokens
    ``worth`` (a dict, changed by the caller as it goes) and wall-clock cycles ``cycles_ms`` per state, the server's
    first ``early[0]`` cycles ``early[1]`` ms whatever the state (its first requests); returns the policy and a
    ``step(n)`` that runs n decode steps (announce, cycle, verify)."""
    now = [0.0]
    policy = CostAwarePolicy([3, 7], 3, update_interval=8, settle=2, clock=lambda: now[0], reprice=reprice)
    policy.set_costs(CycleCost(replay or {(3, 1): 0.30, (7, 1): 0.54}))
    policy.expected_tokens = worth.get
    done = [0]

    def step(n: int) -> None:
        for _ in range(n):
            steps = policy.get_steps_for_batch(1)
            now[0] += (early[1] if done[0] < early[0] else cycles_ms[steps]) / 1e3
            done[0] += 1
            policy.on_verify_complete([0], 1)

    return policy, step


def test_a_stale_price_is_learnt_again():
    """Trained tiny pair, one H200, batch 1: a cost server priced the chain of 3 from its first requests (3.3-3.6 ms
    beyond its graphs), went to the chain of 7 and held it for 2444 of 2483 steps (accept 2.33, 3.05 ms a cycle)
    beside a static chain of 3 at 2.5 ms a cycle (accept 2.0): 0.95x its tokens per second. Capped by the chain of 7's
    cycle, the stale price is never below it, so 7's extra tokens always win. Re-priced after REPRICE[0] verifies, the
    chain of 3 learns its 2.5 ms again and holds; without re-pricing the policy stays at 7."""
    for reprice in (None, REPRICE):
        worth = {3: 1.985, 7: 2.9}  # the first requests: deep chains pay
        policy, step = stale_price_server(reprice, worth, {3: 2.5, 7: 3.05})
        step(40)
        assert policy.current == 7 and policy.costs.rest[3, 1] > 3.0  # left 3 with its early price
        worth[7] = 2.161  # the server's estimate later: 3 at 2.5 ms is worth 12 % more than 7 at 3.05
        step(REPRICE[0] + 3 * policy.update_interval)
        if reprice is None:
            assert policy.current == 7 and policy.reprices == 0
            continue
        assert policy.current == 3 and policy.reprices == 1, policy.report()
        assert policy.costs.cost(3, 1) == pytest.approx(2.5)  # its price from its new cycles alone
        step(2000)
        # 7 re-priced now and then (after REPRICE[0] and twice that: each return to 3 doubles the wait), 3 kept
        assert policy.current == 3 and policy.reprices == 3, REPRICE
        assert policy.report()["reprices"] == policy.reprices


def test_repricing_backs_off_while_the_stale_price_was_right():
    """When the re-priced state costs what it was priced at, the policy returns to the state it left and the next
    re-pricing waits twice as long, up to REPRICE[1]: a re-pricing costs ``settle + REPRICE[2]`` verifies in the
    worse state, so few verifies go to it."""
    worth = {3: 1.0, 7: 2.0}  # 7 far better at these cycles
    policy, step = stale_price_server(REPRICE, worth, {3: 2.5, 7: 3.05}, early=(0, 0.0))
    step(3 * policy.update_interval)  # 3 priced at its true cycle, then left for 7
    assert policy.current == 7 and policy.costs.counted(3, 1)
    starts, elsewhere = [], 0
    for i in range(16 * REPRICE[0]):
        before = policy.reprices
        step(1)
        elsewhere += policy.current != 7
        if policy.reprices != before:
            starts.append(i)
    waits = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert policy.current == 7 and len(starts) >= 4, starts
    own = policy.settle + REPRICE[2]
    expected = [min(2 ** (i + 1) * REPRICE[0], REPRICE[1]) + own for i in range(len(waits))]
    assert all(0 <= w - e <= 2 * policy.update_interval for w, e in zip(waits, expected, strict=True)), waits
    assert elsewhere <= len(starts) * (own + policy.update_interval), elsewhere


def test_a_repricing_goes_through_the_ranks_agreement_and_forgets_the_price():
    """Under tensor parallelism the re-priced state is rank 0's choice (staleness counts verifies, which every rank
    sees alike, so every rank re-prices at the same verify); rank 0 keeping the state in force re-prices nothing.
    The re-priced state's price is forgotten: its next cycles set it, as a state never counted there."""
    calls = []
    worth = {3: 1.0, 7: 2.0}
    now = [0.0]
    policy = CostAwarePolicy([3, 7], 7, update_interval=8, settle=2, clock=lambda: now[0],
                             agree=lambda steps: calls.append(steps) or steps)
    policy.set_costs(CycleCost({(3, 1): 0.30, (7, 1): 0.54}))
    policy.expected_tokens = worth.get
    policy._in_force_at[3, 1] = 0
    for wall in (4.0, 4.0, 4.0):
        policy.costs.observe_cycle(3, 1, wall)
    while policy.reprices == 0:
        now[0] += 3e-3
        policy.get_steps_for_batch(1)
        policy.on_verify_complete([0], 1)
    assert policy.current == 3 and calls[-1] == 3 and not policy.costs.counted(3, 1)
    assert policy.costs.cost(3, 1) == pytest.approx(0.30 + policy.costs.rest[7, 1])  # borrowed until counted again
    held = CostAwarePolicy([3, 7], 7, update_interval=8, settle=2, agree=lambda steps: 7)  # rank 0 says: stay
    held.set_costs(CycleCost({(3, 1): 0.30, (7, 1): 0.54}))
    held.expected_tokens = worth.get
    held._in_force_at[3, 1] = 0
    for _ in range(REPRICE[0] + 2 * held.update_interval):
        held.on_verify_complete([0], 1)
    assert held.current == 7 and held.reprices == 0


def test_forget_learns_a_price_again_from_the_next_cycles():
    c = CycleCost({(3, 1): 0.3, (7, 1): 0.5})
    for wall in (4.0, 4.1, 3.9, 4.0):
        c.observe_cycle(3, 1, wall)
    for wall in (3.0, 3.0, 3.0):
        c.observe_cycle(7, 1, wall)
    c.forget(3, 1)
    assert not c.counted(3, 1) and c.cost(3, 1) == pytest.approx(0.3 + 2.5)  # borrowed: 7's rest
    for wall in (2.5, 2.4, 2.6):
        c.observe_cycle(3, 1, wall)
    assert c.cost(3, 1) == pytest.approx(2.5)  # the lower median of the new cycles, not an EMA of the old


def test_a_repricing_measures_and_does_not_move_across_a_near_tie():
    """A re-priced state that turns out worth less than ``1 + margin`` times the state it left does not stay in force,
    even as the best by a little: else a near tie would drift to whichever state was re-priced last (bench.policy_sim's
    tiny-pair traffic, re-pricing every 256 verifies without this rule: 296 / 779 / 650 steps at 3 / 5 / 7 instead
    of 1678 at 5)."""
    worth = {3: 1.0, 7: 2.0}
    policy, step = stale_price_server(REPRICE, worth, {3: 2.5, 7: 3.05}, early=(0, 0.0))
    step(3 * policy.update_interval)
    assert policy.current == 7
    worth[3] = 2.0 * 2.5 / 3.05 * 1.03  # at their cycles, 3 is worth 1.03x 7: within the margin
    while policy.reprices == 0:
        step(1)
    assert policy.current == 3
    step(policy.settle + REPRICE[2])
    assert policy.current == 7 and policy.best(1) == 3 and policy._reprice_every == 2 * REPRICE[0]


def test_steps_0_priced_from_slow_first_steps_is_re_priced_too():
    """Steps 0 priced from a server's slow first steps (one H200: 2.30 ms beyond its graph against a 1.6-1.8 ms whole
    step) would keep a drafting state that commits too little for its cycle; re-priced, steps 0 holds."""
    for reprice in (None, REPRICE):
        now = [0.0]
        policy = CostAwarePolicy([0, 3], 0, update_interval=8, settle=2, clock=lambda now=now: now[0],
                                 reprice=reprice)
        policy.set_costs(CycleCost({(0, 1): 0.13, (3, 1): 0.30}))
        worth = {0: 1.0, 3: 2.2}
        policy.expected_tokens = worth.get
        for i in range(40 + REPRICE[0] + 4 * policy.update_interval):
            if i == 40:
                worth[3] = 1.3  # 3 at 2.5 ms now worth 0.52 tokens a ms, steps 0 at 1.7 ms 0.59 (its old price: 0.26)
            steps = policy.get_steps_for_batch(1)
            now[0] += (3.8 if i < 30 else {0: 1.7, 3: 2.5}[steps]) / 1e3
            policy.on_verify_complete([0], 1)
            if i == 39:
                assert policy.current == 3
        assert policy.current == (3 if reprice is None else 0), (reprice, policy.report())


def repricing_at_batch_1():
    """A batch-1 policy over chains of 3 and 7 (graphs captured at 1 and 16) whose first re-pricing (of 3, 7 being
    worth twice as much) has just begun; returns it and its ``step(n)``."""
    replay = {(3, 1): 0.30, (7, 1): 0.54, (3, 16): 0.5, (7, 16): 0.9}
    policy, step = stale_price_server(REPRICE, {3: 1.0, 7: 2.0}, {3: 2.5, 7: 3.05}, early=(0, 0.0), replay=replay)
    step(3 * policy.update_interval)
    while policy.reprices == 0:
        step(1)
    return policy, step


def test_a_batch_size_change_ends_a_repricing():
    """A re-pricing is a measurement at one batch size: when the batch pads to another size before it decides, that
    size decides at once, as at any batch-size change, and nothing of the re-pricing is left to decide later."""
    policy, step = repricing_at_batch_1()
    assert policy.current == 3 and policy._repricing == (3, 7, 1)
    for _ in range(policy.settle + 2):  # before the re-pricing's own decision (settle + REPRICE[2] verifies)
        policy.get_steps_for_batch(16)
        policy.on_verify_complete([0] * 16, 16)
    assert policy._repricing is None and not policy._probing and policy._decided_at == 16


def test_tensor_parallel_ranks_call_the_agreement_alike_through_probes_and_repricings():
    """Every rank sees the same verifies and batches but times its own cycles: the agreement (a broadcast) must be
    called at the same verifies on every rank, or the server hangs. Two ranks with differently noisy clocks, in
    lockstep, rank 1 adopting rank 0's broadcasts in order, through batch-size changes, steps 0, probes and
    re-pricings: the same calls, the same state in force. Can fail: a re-pricing's end that skips the agreement where
    a rank would return to the state it left desynchronises them (caught). A condition on a rank's own timing before
    the agreement is only caught if it diverges in these 9000 steps."""
    replay = {(s, bs): 0.1 + 0.03 * s + 0.01 * bs for s in (0, 1, 3, 7) for bs in (1, 16)}
    broadcasts, calls = [], [0, 0]

    def agree(rank):
        def call(steps):
            calls[rank] += 1
            if rank == 0:
                broadcasts.append(steps)
                return steps
            assert calls[1] <= len(broadcasts), "rank 1 called the agreement where rank 0 did not"
            return broadcasts[calls[1] - 1]
        return call

    clocks, policies = [], []
    for rank in (0, 1):
        now = [0.0]
        clocks.append(now)
        policy = CostAwarePolicy([0, 1, 3, 7], 3, clock=lambda now=now: now[0], agree=agree(rank))
        policy.set_costs(CycleCost(replay))
        policies.append(policy)
    rng, noise = random.Random(5), [random.Random(11), random.Random(12)]
    rates, bs = [0.7] * 7, 1
    for step in range(9000):
        if step % 700 == 0:
            bs = rng.choice([1, 2, 16])
            rates = [rng.choice([0.05, 0.5, 0.9])] * 7
        steps_now = [p.get_steps_for_batch(bs) for p in policies]
        assert steps_now[0] == steps_now[1], step
        if rng.random() < 0.01:
            for p in policies:
                p.forget_last_step()
        accepted = chain_verifies(rates, steps_now[0], bs, rng)
        for rank, p in enumerate(policies):
            pause = 20.0 if noise[rank].random() < 0.05 else 0.0  # a cycle only this rank drops as a pause
            clocks[rank][0] += ((1.5 + 0.3 * steps_now[0]) * noise[rank].lognormvariate(0, 0.3) + pause) / 1e3
            p.on_verify_complete(accepted, bs)
        assert calls[0] == calls[1] and policies[0].current == policies[1].current, step
    assert policies[0].reprices > 0 and policies[0].probes > 0 and policies[0].switches > 20


def test_a_repricing_ending_at_another_batch_size_is_an_ordinary_decision():
    """The batch moved to another bucket within the re-pricing's last verify (no batch-size decision yet): the end is
    an ordinary decision there, and the wait before the next re-pricing is left as it was (nothing was measured at
    the new size)."""
    policy, step = repricing_at_batch_1()
    for _ in range(policy.settle + REPRICE[2] - 1):
        step(1)
    assert policy._repricing is not None
    policy.get_steps_for_batch(16)
    policy.on_verify_complete([0] * 16, 16)
    assert policy._repricing is None and policy._reprice_every == REPRICE[0] and policy._decided_at == 16


def test_a_probe_relearns_a_stale_price_and_steps_0_keeps_its_own_until_a_new_cycle():
    """Steps 0's probe puts a drafting state in force as a re-pricing would: a stale price of it is forgotten too (a
    drafting price learnt from slow first cycles is then not carried through every probe). Forgotten, steps 0 (which
    borrows from no drafting state) keeps its old rest until its first new cycle, not 0 (its graph alone)."""
    policy, verify = make_policy([0.02] * 7, probe=PROBE)
    policy.set_costs(CycleCost(HOST_BOUND))
    for wall in (9.0, 9.0, 9.0):
        policy.costs.observe_cycle(7, 1, wall)
    policy._in_force_at[7, 1] = -10 * REPRICE[0]
    policy.expected_tokens = {0: 1.0, 1: 0.1, 3: 0.1, 7: 3.0}.get
    policy.current, policy._off_verifies = 0, PROBE[0]
    policy._start_probe(1)
    assert policy.current == 7 and not policy.costs.counted(7, 1)
    c = CycleCost({(0, 1): 0.1, (7, 1): 0.5})
    for wall in (2.0, 2.0, 2.0):
        c.observe_cycle(0, 1, wall)
    c.forget(0, 1)
    assert c.cost(0, 1) == pytest.approx(2.0)
    c.observe_cycle(0, 1, 1.5)
    assert c.cost(0, 1) == pytest.approx(1.5)


def test_depth_counts_match_request_by_request_counting():
    """DepthAcceptance.observe counts by a histogram of the batch's accepted drafts: the same tried / passed counts as
    walking each request's chain depth by depth (a request that accepted k of s drafts reached depths 1..min(k + 1,
    s) and passed 1..k), on random batches with out-of-range counts clamped."""
    rng = random.Random(7)
    fast = DepthAcceptance(7, decay=1.0)
    tried, passed = [0.0] * 8, [0.0] * 8
    for _ in range(300):
        steps = rng.choice([1, 3, 5, 7])
        ks = [rng.randint(-1, steps + 1) for _ in range(rng.choice([1, 2, 16, 64]))]
        fast.observe(steps, ks)
        for k in ks:
            k = min(max(k, 0), steps)
            for d in range(1, min(k + 1, steps) + 1):
                tried[d] += 1
                passed[d] += d <= k
    assert fast.tried == tried and fast.passed == passed
