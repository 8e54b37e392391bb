"""Cost-aware adaptive speculation: the step count whose expected committed tokens per millisecond is highest.

SGLang's ``--speculative-adaptive`` keeps one runtime state (draft, verify and draft-extend CUDA graphs) per
candidate step count and asks a policy before every decode step which one to put in force. Its own policy
(``adaptive_spec_params.AdaptiveSpeculativeParams``) follows an EMA of accepted drafts within fixed batch-size
brackets and never looks at what a step costs. :class:`CostAwarePolicy` has the same interface and decides by

    value(s, bs) = expected_tokens(s) / cost(s, bs)        (committed tokens per ms, per request)

- ``expected_tokens(s) = 1 + sum_{d=1..s} prod_{i<=d} rate(i)``: :class:`DepthAcceptance` estimates the chance
  ``rate(d)`` that the draft at depth ``d`` is accepted given depth ``d - 1`` was, from every verify's accepted
  counts (a request that accepted ``k`` of ``s`` drafts passed depths 1..k and failed depth k + 1, unless
  ``k = s``), with a Beta prior and exponential forgetting; a depth never tried (a deeper candidate than the one in
  force) takes the rate of the deepest depth observed, so unused candidates are still predicted. Steps 0 (no
  draft) commits 1 token.
- ``cost(s, bs)``: :class:`CycleCost` holds the device time of each state's CUDA graphs at each captured batch
  size, replayed at start-up (:func:`replay_ms`), plus the rest of a cycle (host work, kernels outside graphs,
  attention over real prefixes) measured online as the wall-clock cycle of a state minus its replay time, per
  (state, batch bucket). Under overlap scheduling the time between two decode steps' calls is the GPU time of the
  step before the first, so a cycle is timed only when two consecutive steps ran the same state at the same batch
  size. A state's rest counts once it rests on ``first`` (3) cycles there; until then a drafting state is priced at
  its graphs plus the smallest counted rest of another drafting state at that bucket (none counted: its own first
  samples if two, else its own counted rest at the nearest smaller bucket, else its one sample, else nothing;
  steps 0, which skips the tree work, borrows from no other state): one or two cycles may be a pause. Borrowed, a
  rest overprices a shallower state (the rest grows with the verified tokens); priced low, a state looks cheap, is
  tried when that makes it look best, then priced by what it did.

Decisions: every ``update_interval`` verifies, and as soon as the batch has padded to another captured size than at
the last decision for two decode steps in a row (the value of a shape depends on the batch: a chain chosen at batch
1 costs twice as much at 64, and waiting for the next verifies would run the whole first stretch of a new batch in
the old shape), once the state in force has had a verify counted since it was put in force (``settle`` + 1
verifies: a batch hovering at a size boundary switches at most that often, and every switch leaves the acceptance
model at least one verify). A batch-size decision takes no hysteresis margin unless the state in force was chosen
or kept at that size since it was put in force: a state chosen for another size has no claim there.

Steps 0 learns nothing of acceptance (no draft is verified there), so an estimate learnt on hard requests would hold
steps 0 through easy ones: after ``PROBE[0]`` verifies at steps 0 the policy ages its evidence by them and puts the
drafting state of best value in force, deciding after ``PROBE[2]`` counted verifies; a return to steps 0 within the
probe's first decisions doubles the wait (up to ``PROBE[1]``), a later one or leaving steps 0 by itself resets it.

A state's price is learnt while it is in force and kept while another state runs, so a price learnt from slow cycles
(a server's first requests: one H200 priced the chain of 3 at 3.3-3.6 ms beyond its graphs from them, and the policy
then held the chain of 7 for 2444 steps, 0.95x the static chain of 3's tokens per second) would hold for good. Every
state's price at a batch bucket has an age: the counted verifies since it was last in force there. After
``REPRICE[0]`` verifies in which a candidate's price there has aged that long, the policy re-prices it at a decision
that keeps a drafting state in force: the stale candidate of best value (steps 0 included: a server priced it at 2.30 ms
beyond its graph from its first steps, against a 1.6-1.8 ms whole step) goes in force with its price
forgotten (:meth:`CycleCost.forget`: its next cycles set it again) for ``REPRICE[2]`` counted verifies, then the
state it left returns unless another is worth ``1 + margin`` times it; a return doubles the wait (up to
``REPRICE[1]``), any other outcome resets it; a batch-size decision first ends it. Steps 0's probe forgets a price as
stale as that of the state it probes. ``python -m bench.policy_sim --reprice`` weighs it against none.

Under tensor parallelism every rank keeps the policy and sees the same verifies, but times its own cycles: at each
decision the ranks adopt rank 0's choice (``agree``, a broadcast over SGLang's TP CPU group), so all run one shape.

Hysteresis: the policy re-decides every ``update_interval`` verifies, ignores the ``settle`` verifies after a switch
(with overlap scheduling they may still come from the previous state), and switches only to a candidate worth
``1 + margin`` times the current one. Every candidate gets graphs at every captured batch size (SGLang's brackets
restrict them; this policy chooses by value at every size). Reviewer's page: docs/adaptive.md.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections import deque

logger = logging.getLogger(__name__)

# Steps 0's probe: (verifies at steps 0 before the first probe, the longest wait between probes, a probe's counted
# verifies before it decides); bench.policy_sim weighs it against no probe
PROBE = (64, 1024, 4)
# Re-pricing a stale price (module docstring): (counted verifies since a candidate was last in force at a bucket before
# its price there is stale, the longest wait, a re-pricing's counted verifies before it decides)
REPRICE = (512, 4096, 4)


def chain_tokens(rates) -> float:
    """Expected tokens a verify commits per request for a chain whose depth ``d`` draft is accepted with chance
    ``rates[d - 1]`` given depth ``d - 1`` was: ``1 + sum_d prod_{i <= d} rates[i - 1]`` (the bonus included)."""
    total, reach = 1.0, 1.0
    for rate in rates:
        reach *= rate
        total += reach
    return total


class DepthAcceptance:
    """Per-depth conditional acceptance of chain drafts (depth 1 = the first draft token).

    ``prior``: (rate, weight) of the Beta prior every depth starts from; ``decay``: each observed verify multiplies
    the counts so far by it (forgetting: about ``1 / (1 - decay)`` verifies remembered).
    """

    def __init__(self, max_depth: int, prior: tuple[float, float] = (0.6, 4.0), decay: float = 0.98):
        self.prior_rate, self.prior_weight = prior
        self.decay = decay
        self.passed = [0.0] * (max_depth + 1)  # index d: requests that passed depth d (d >= 1)
        self.tried = [0.0] * (max_depth + 1)  # requests whose depth d was drafted and reached

    def observe(self, steps: int, correct_per_req: list[int]) -> None:
        """One verify at ``steps`` drafted tokens per request; ``correct_per_req``: accepted drafts per request."""
        if steps <= 0 or not correct_per_req:
            return
        self.fade(self.decay)
        counts = [0] * (steps + 1)  # requests by accepted drafts (a histogram: one pass over the batch, not bs x steps)
        for k in correct_per_req:
            counts[min(max(int(k), 0), steps)] += 1
        passed = 0  # requests that accepted at least d drafts
        for d in range(steps, 0, -1):
            passed += counts[d]
            self.tried[d] += passed + counts[d - 1]  # depth d was drafted and reached: d - 1 or more accepted
            self.passed[d] += passed

    def fade(self, factor: float) -> None:
        """Multiplies the counts so far by ``factor``: older evidence weighs less against the prior."""
        self.passed = [p * factor for p in self.passed]
        self.tried = [t * factor for t in self.tried]

    def rate(self, depth: int) -> float:
        """Estimated chance the draft at ``depth`` is accepted given depth - 1 was; unobserved depths take the
        rate of the deepest observed depth above them (or the prior)."""
        observed = [d for d in range(1, len(self.tried)) if self.tried[d] >= 1.0]
        d = depth if depth in observed else max((o for o in observed if o < depth), default=depth)
        if d >= len(self.tried):
            d = len(self.tried) - 1
        w = self.prior_weight
        return (self.passed[d] + w * self.prior_rate) / (self.tried[d] + w)

    def expected_tokens(self, steps: int) -> float:
        """Expected tokens one verify commits per request with a chain of ``steps`` drafts (bonus included)."""
        return chain_tokens(self.rate(d) for d in range(1, steps + 1))


def tree_tokens(rate, steps: int, topk: int, n: int) -> float:
    """Expected tokens one verify commits per request for the tree SGLang would keep at (steps, topk, n) if the
    draft's scores were the acceptance chances ``rate(depth, rank)`` (depth 1 = the first draft level; rank 0 = the
    draft's best child of a node): level by level every frontier node's ``topk`` children are valued at the parent's
    value times ``rate``, the ``topk`` best become the next frontier, and the ``n - 1`` best of all levels are kept
    (``select_top_k_tokens`` / ``organize_draft_results``); the result is 1 (the bonus) plus the kept values. A chain
    (topk 1, n = steps + 1) gives :func:`chain_tokens` of ``rate(d, 0)``."""
    nodes, frontier = [], [1.0]
    for depth in range(1, steps + 1):
        rates = [rate(depth, r) for r in range(topk)]
        children = [value * q for value in frontier for q in rates]
        nodes += children
        frontier = sorted(children, reverse=True)[:topk]
    return 1.0 + sum(sorted(nodes, reverse=True)[:n - 1])


class TreeAcceptance:
    """Per-depth, per-sibling-rank acceptance of tree drafts: ``rate(d, r)``, the chance that the target's token
    after an accepted node at depth ``d - 1`` is that node's child of sibling rank ``r`` (rank 0: the draft's best),
    which predicts trees that are not in force (:func:`tree_tokens`).

    Evidence: ``tried`` / ``passed`` counts [depth][rank] (:meth:`load`, from :class:`TreeEvidence`, which counts and
    decays them on the device). SGLang keeps a node's children as a prefix of its ranks (a child's score is the
    parent's times its probability), and the target's token is at most one of them, so each kept rank ``r < m`` of a
    reached node is one trial of ``(d, r)`` and the accepted one its success.

    Priors (Beta, weight ``prior[1]``): rank 0 ``prior[0]``; rank ``r > 0`` at a depth, ``(1 - rate(d, 0)) *
    share * ratio ** (r - 1)`` (``sibling_share``: what ranks below the first take of the rest, halving per rank;
    shaped after the benchmark profile, bench/README.md, and overridden by observed trials). A depth never tried at
    a rank takes the deepest depth above it tried at that rank.
    """

    def __init__(self, max_depth: int, max_rank: int, prior: tuple[float, float] = (0.6, 4.0),
                 sibling_share: tuple[float, float] = (0.35, 0.5)):
        self.prior_rate, self.prior_weight = prior
        self.share, self.ratio = sibling_share
        self.max_depth, self.max_rank = max_depth, max_rank
        self.passed = [[0.0] * max_rank for _ in range(max_depth + 1)]  # [depth][rank], depth >= 1
        self.tried = [[0.0] * max_rank for _ in range(max_depth + 1)]
        # rates, predictions and tried depths since the last load (the counts change only there): a decision values
        # every candidate tree, each level asking every rank's rate (a tree decision ~570 -> ~250 us of host, CI CPU)
        self._rates: dict[tuple[int, int], float] = {}
        self._tokens: dict[tuple[int, int, int], float] = {}
        self._depths: list[list[int | None]] = []

    def load(self, tried: list, passed: list) -> None:
        """The counts, [depth][rank] each (as :class:`TreeEvidence` keeps them), replace these."""
        for mine, theirs in ((self.tried, tried), (self.passed, passed)):
            for d in range(min(len(mine), len(theirs))):
                row = theirs[d][:self.max_rank]
                mine[d][:len(row)] = row
        self._rates.clear()
        self._tokens.clear()
        self._depths.clear()

    def _depth_for(self, depth: int, rank: int) -> int | None:
        """``depth`` if tried at ``rank``, else the deepest depth above it that was (None: none)."""
        if not self._depths:  # [rank][depth] -> that depth or the deepest tried one above it, per load
            for r in range(self.max_rank):
                last, row = None, [None]
                for d in range(1, self.max_depth + 1):
                    last = d if self.tried[d][r] >= 1.0 else last
                    row.append(last)
                self._depths.append(row)
        return self._depths[rank][min(depth, self.max_depth)]

    def rate(self, depth: int, rank: int) -> float:
        rate = self._rates.get((depth, rank))
        if rate is None:
            rate = self._rates[depth, rank] = self._rate(depth, rank)
        return rate

    def _rate(self, depth: int, rank: int) -> float:
        if rank >= self.max_rank:
            return 0.0
        if rank == 0:
            prior = self.prior_rate
        else:
            prior = (1.0 - self.rate(depth, 0)) * self.share * self.ratio ** (rank - 1)
        d = self._depth_for(depth, rank)
        passed, tried = (0.0, 0.0) if d is None else (self.passed[d][rank], self.tried[d][rank])
        w = self.prior_weight
        return (passed + w * prior) / (tried + w)

    def expected_tokens(self, steps: int, topk: int = 1, n: int | None = None) -> float:
        """Expected tokens one verify commits per request at (steps, topk, n) (default n: a chain's steps + 1)."""
        if steps <= 0:
            return 1.0
        key = (steps, topk, steps + 1 if n is None else n)
        tokens = self._tokens.get(key)
        if tokens is None:
            tokens = self._tokens[key] = tree_tokens(self.rate, *key)
        return tokens


class TreeEvidence:
    """Device tables of :func:`sgl_eagle_triton.kernels.tree_evidence.tree_evidence` (``tried`` / ``passed`` per depth
    and sibling rank), multiplied by ``decay`` before each verify's counts are added, and read by the host without a
    sync: :meth:`snapshot` returns the copy finished last and starts the next (one decision late).

    ``add`` is called after every verify (the worker wraps SGLang's ``eagle_sample``), eagerly, on the stream the
    verify ran on: two launches (the decay, the counts; the kernel takes SGLang's accept lengths as they are);
    one-node trees (steps 0) add nothing and do not decay the tables."""

    def __init__(self, max_depth: int, ranks: int, device, decay: float = 0.98):
        import torch

        from sgl_eagle_triton.kernels.tree_evidence import tree_evidence

        self.decay, self._count = decay, tree_evidence
        self.tables = torch.zeros(2, max_depth + 1, ranks, dtype=torch.float32, device=device)
        cuda = self.tables.device.type == "cuda"
        self._host = torch.zeros(self.tables.shape, dtype=torch.float32, pin_memory=cuda)
        self._copied = None  # the CUDA event of the copy in flight (None: none, or a CPU table)
        self._ready = None

    def add(self, accept_index, accept_lens, verify_input) -> None:
        """One verify's results (``eagle_sample``'s accept index [bs, S + 1] int32 and accept lengths [bs] int32,
        the bonus included) over its tree (``verify_input.retrieve_*`` [bs, n])."""
        next_token = verify_input.retrieve_next_token
        if next_token.dim() != 2 or next_token.shape[0] == 0 or next_token.shape[1] < 2:
            return
        self.tables.mul_(self.decay)
        self._count(self.tables[0], self.tables[1], accept_index.contiguous(), accept_lens.contiguous(),
                    verify_input.retrieve_index.contiguous(), next_token.contiguous(),
                    verify_input.retrieve_next_sibling.contiguous(), bonus_included=True)  # no "- 1" launch

    def compile(self, shapes) -> None:
        """The counting kernel run on one and on two chains of each ``(draft tokens n, steps)`` into scratch tables,
        so that Triton compiles it before serving (as ``verify.compile_verify_kernels``)."""
        import torch

        from sgl_eagle_triton.kernels.tree_rows import start_up_chains, verify_outputs

        scratch = torch.zeros_like(self.tables)
        for n, steps, requests, tree in start_up_chains(shapes, scratch.device):
            if n > 1:  # one-node trees add nothing (add)
                _, accept_index, accepted = verify_outputs(requests, n, steps, scratch.device)
                self._count(scratch[0], scratch[1], accept_index, accepted.fill_(1), *tree[1:],
                            bonus_included=True)  # as add calls it: accept lengths (1: no draft accepted)

    def snapshot(self) -> tuple[list, list] | None:
        """``(tried, passed)`` as nested lists [depth][rank] from the last finished copy (None before the first),
        and a new copy started."""
        import torch

        if self._copied is not None and self._copied.query():
            self._ready, self._copied = self._host.tolist(), None
        if self._copied is None:
            self._host.copy_(self.tables, non_blocking=True)
            if self.tables.device.type == "cuda":
                self._copied = torch.cuda.Event()
                self._copied.record()
            else:
                self._ready = self._host.tolist()
        return None if self._ready is None else (self._ready[0], self._ready[1])


RECENT = 32  # rests kept per (steps, bucket) for the report's spread
# a decode cycle longer than PAUSE_FACTOR x the expected cycle + PAUSE_MS is a pause (a prefill or a stall between two
# steps): CycleCost drops it from a state's price; the cycle timing's per-state line gives the share of a state's time
# in such periods, with the state's median period as its expected cycle
PAUSE_FACTOR, PAUSE_MS = 2.0, 1.0


class CycleCost:
    """Decode-cycle cost in ms per (steps, captured batch size).

    ``replay``: {(steps, bs): ms} of the state's CUDA graphs at that batch size (a missing entry: that state runs
    eagerly there, priced as its nearest captured size scaled by the batch). ``alpha``: EMA weight of an online
    measurement of the rest of the cycle, kept per (steps, bucket): what a state costs outside its graphs depends on
    the state (steps 0 runs no tree bookkeeping, verify kernels or draft extend; a deep tree verifies more tokens
    over the real prefixes than the replays price), so one state's rest says little about another's.
    """

    def __init__(self, replay: dict[tuple[int, int], float], alpha: float = 0.1, first: int = 3,
                 cap_by_deeper: bool = True):
        self.replay = dict(replay)
        self.cap_by_deeper = cap_by_deeper  # rest_ms; False: each state's own rest alone (bench.policy_sim's A/B)
        self.sizes = sorted({bs for _, bs in replay})
        self._buckets: dict[int, int] = {}  # batch size -> bucket (bucket)
        self.alpha, self.first = alpha, first
        self.rest: dict[tuple[int, int], float] = {}  # (steps, bucket) -> ms of the cycle outside the graphs (EMA)
        self._early: dict[tuple[int, int], list[float]] = {}  # a state's first samples at a bucket
        self._recent: dict[tuple[int, int], deque] = {}  # its last RECENT rests there (the report's spread)
        self.timed: dict[tuple[int, int], int] = {}  # (steps, bucket) -> cycles timed there, pauses included
        self.dropped: dict[tuple[int, int], int] = {}  # ... of them dropped as pauses

    def counted(self, steps: int, bucket: int) -> bool:
        """Whether the state's rest at ``bucket`` rests on ``first`` cycles."""
        return len(self._early.get((steps, bucket), ())) >= self.first

    def bucket(self, batch_size: int) -> int:
        """The captured batch size a batch pads to (the largest when beyond)."""
        bucket = self._buckets.get(batch_size)
        if bucket is None:  # asked several times a step: each batch size's bucket found once
            i = bisect.bisect_left(self.sizes, batch_size)
            bucket = self._buckets[batch_size] = self.sizes[min(i, len(self.sizes) - 1)]
        return bucket

    def graphs_ms(self, steps: int, batch_size: int) -> float:
        bucket = self.bucket(batch_size)
        if (steps, bucket) in self.replay:
            return self.replay[steps, bucket]
        known = sorted(bs for s, bs in self.replay if s == steps)
        if not known:
            raise KeyError(f"no replay time for steps {steps}")
        near = min(known, key=lambda bs: abs(bs - bucket))
        return self.replay[steps, near] * bucket / near

    def observe_cycle(self, steps: int, batch_size: int, wall_ms: float) -> bool:
        """One timed cycle of ``steps`` at ``batch_size``; False when dropped as a pause."""
        key = (steps, self.bucket(batch_size))
        graphs = self.graphs_ms(steps, batch_size)
        rest = max(wall_ms - graphs, 0.0)
        self.timed[key] = self.timed.get(key, 0) + 1
        early = self._early.setdefault(key, [])
        recent = self._recent.setdefault(key, deque(maxlen=RECENT))
        if len(early) < self.first:  # the lower median of the first samples (one may be a pause: measured 90 ms
            early.append(rest)      # against 5 ms at the first step of a batch size)
            recent.append(rest)
            self.rest[key] = sorted(early)[(len(early) - 1) // 2]
            return True
        old = self.rest.get(key)
        # a prefill or a pause fell between the two steps: over twice the expected cycle (not a multiple of the rest
        # alone: a rest learnt as 0 would then drop every later sample above 1 ms and stay 0 for good)
        if old is not None and wall_ms > PAUSE_FACTOR * (graphs + old) + PAUSE_MS:
            self.dropped[key] = self.dropped.get(key, 0) + 1
            return False
        recent.append(rest)
        self.rest[key] = rest if old is None else (1 - self.alpha) * old + self.alpha * rest
        return True

    def forget(self, steps: int, batch_size: int) -> None:
        """The state's price at the batch's bucket is learnt again from its next cycles (the lower median of the first
        :attr:`first`, then the EMA): until :attr:`first` arrive it is priced as a state not yet counted there (a
        drafting state borrows; steps 0 keeps its old rest until its first new cycle), and its spread starts over."""
        key = (steps, self.bucket(batch_size))
        self._early.pop(key, None)
        self._recent.pop(key, None)

    def spread(self) -> dict[tuple[int, int], tuple[float, float, int]]:
        """Per (steps, bucket): the least and the largest of the last :data:`RECENT` rests counted there (ms outside
        the graphs) and how many there are: how far a price could move on the cycles it was learnt from."""
        return {key: (min(recent), max(recent), len(recent)) for key, recent in self._recent.items() if recent}

    def rest_ms(self, steps: int, batch_size: int) -> float:
        """The state's own rest (:meth:`_own_rest`), lowered where a state that does all its work and more (more
        steps, graphs at least as long: :meth:`dominates`) has a counted cycle at the batch's bucket that is shorter
        than the state's own: a cycle is not longer than a deeper state's (host work and graphs both a subset).
        Without this an own rest learnt from a few slow cycles (a server's first requests: a chain of 3 priced 4.9 ms
        from them, 3.2 ms once tried again, one H200) keeps the state from being tried again while the deeper
        state's price moves on."""
        bucket = self.bucket(batch_size)
        own = self._own_rest(steps, bucket)
        if not self.cap_by_deeper:
            return own
        graphs = self.graphs_ms(steps, bucket)
        caps = [self.graphs_ms(s, bucket) + ms - graphs for (s, b), ms in self.rest.items()
                if b == bucket and self.counted(s, b) and self.dominates(s, steps, bucket)]
        return min([own, *caps])

    def dominates(self, deeper: int, steps: int, bucket: int) -> bool:
        """Whether the state ``deeper`` does all of the state ``steps``' work at ``bucket``: more steps, and graphs
        (draft, verify, draft extend) at least as long there."""
        return deeper > steps and self.graphs_ms(deeper, bucket) >= self.graphs_ms(steps, bucket)

    def _own_rest(self, steps: int, bucket: int) -> float:
        """The state's rest at ``bucket`` once counted (:meth:`counted`); until then, for a drafting state, the
        smallest counted rest of another drafting state there (steps 0 borrows none: it runs no tree work), else
        its own first two samples' lower median, else its own counted rest at the nearest smaller bucket (the rest
        grows with the batch: still a low price, so the state is tried), else its one sample (maybe a pause), else
        0."""
        if self.counted(steps, bucket):
            return self.rest[steps, bucket]
        borrowed = [ms for (s, b), ms in self.rest.items()
                    if steps > 0 and s > 0 and s != steps and b == bucket and self.counted(s, b)]
        if borrowed:
            return min(borrowed)
        if len(self._early.get((steps, bucket), ())) >= 2:
            return self.rest[steps, bucket]
        smaller = [b for s, b in self.rest if s == steps and b < bucket and self.counted(s, b)]
        if smaller:
            return self.rest[steps, max(smaller)]
        return self.rest.get((steps, bucket), 0.0)

    def cost(self, steps: int, batch_size: int) -> float:
        return self.graphs_ms(steps, batch_size) + self.rest_ms(steps, batch_size)


class CostAwarePolicy:
    """Drop-in for SGLang's ``AdaptiveSpeculativeParams`` (what ``AdaptiveController`` calls): decides the step count
    by value (module docstring). ``costs`` is set once the states are built (:meth:`set_costs`); until then it keeps
    ``initial_steps``."""

    def __init__(self, candidate_steps: list[int], initial_steps: int, update_interval: int = 8, settle: int = 2,
                 margin: float = 0.05, clock=time.perf_counter, trees: dict[int, tuple[int, int]] | None = None,
                 evidence: TreeEvidence | None = None, agree=None, probe: tuple[int, int, int] | None = PROBE,
                 reprice: tuple[int, int, int] | None = REPRICE):
        self.candidate_steps = sorted(set(candidate_steps))
        # steps 0's probe (module docstring, PROBE: first wait, longest wait, verifies before it decides); None: none
        self.probe = probe
        self._probe_every = probe[0] if probe else 0
        self._off_verifies = 0  # verifies at steps 0 since steps 0 was put in force or last probed
        self._probing = False  # the state in force was put in force by a probe, not decided yet
        self._probe_at: int | None = None  # the counted verifies at the last probe's start
        self.probes = 0
        self._trial = 0  # the counted verifies a probe or re-pricing runs before it decides
        # re-pricing (module docstring, REPRICE: first wait, longest wait, verifies before it decides); None: none
        self.reprice = reprice
        self._reprice_every = reprice[0] if reprice else 0
        self._in_force_at: dict[tuple[int, int], int] = {}  # (steps, bucket) -> counted verifies when last in force
        # (the state re-priced, the state it left, the bucket it was re-priced at) until it decides
        self._repricing: tuple[int, int, int] | None = None
        self.reprices = 0
        # agree(steps) -> the step count every rank adopts (rank 0's), called at every decision on every rank
        self.agree = agree
        self.current = initial_steps
        # tree candidates (topk > 1): {steps: (topk, draft tokens)}, acceptance from the device evidence
        self.trees, self.evidence = trees, evidence
        if trees:
            self.acceptance = TreeAcceptance(max(self.candidate_steps), max(topk for topk, _ in trees.values()))
        else:
            self.acceptance = DepthAcceptance(max(self.candidate_steps))
        # trees: observed / predicted tokens per candidate that has been in force (EMA); others take the nearest's
        self.efficiency: dict[int, float] = {}
        self._observed = [0.0, 0]  # trees: tokens committed and requests verified since the last decision
        self.costs: CycleCost | None = None
        self.update_interval, self.settle, self.margin = update_interval, settle, margin
        self.cuda_graph_bs: list[int] | None = None
        self._since_switch = 0
        self._verifies = 0
        self._clock = clock
        self._last_step: tuple[float, int, int] | None = None  # (time, steps, batch size) of the last decode step
        # and of the one before it: under overlap scheduling the time from one decode step's call to the next is the
        # GPU time of the step BEFORE the first (SGLang launches step j + 1 once step j - 1's results are in), so a
        # cycle is timed only when both steps ran the same state at the same batch size
        self._step_before: tuple[float, int, int] | None = None
        self._affirmed: set[int] = set()  # captured sizes the state in force was chosen or kept at since put in force
        self._decided_at: int | None = None  # the captured size the batch padded to at the last decision
        self._last_bucket, self._held = None, 0  # the last decode step's captured size, and for how many steps
        self.switches = 0

    # -- AdaptiveSpeculativeParams' interface --------------------------------------------------------------------

    def set_cuda_graph_bs(self, cuda_graph_bs: list[int] | None) -> None:
        self.cuda_graph_bs = sorted(cuda_graph_bs) if cuda_graph_bs else None

    def cuda_graph_bs_for_step(self, step: int) -> list[int] | None:
        """Every candidate gets graphs at every captured batch size."""
        return None if self.cuda_graph_bs is None else list(self.cuda_graph_bs)

    def get_steps_for_batch(self, batch_size: int) -> int:
        """Called before every decode step: the step count to put in force (also times a cycle: ``_step_before``). When
        the batch has padded to another captured size than at the last decision for two steps in a row, the policy
        decides at once (once the state in force has had a verify counted, and ``update_interval`` since start)."""
        now = self._clock()
        if self.costs is not None:
            kept = True
            if self._last_step is not None and self._step_before is not None:
                then, steps, bs = self._last_step
                if self._step_before[1:] == (steps, bs) and bs == batch_size:
                    kept = self.costs.observe_cycle(steps, bs, (now - then) * 1e3)
            bucket = self.costs.bucket(batch_size)
            self._held = self._held + 1 if bucket == self._last_bucket else 1
            self._last_bucket = bucket
            if self._decided_at is None:
                self._decided_at = bucket
            elif (bucket != self._decided_at and self._held >= 2 and self._since_switch > self.settle
                  and self._verifies >= self.update_interval):
                if self.trees:
                    self._refresh_trees()  # the tokens counted so far belong to the state in force
                if self._repricing is not None:  # a re-pricing at another size ends: this size decides afresh
                    self._repricing, self._probing = None, False
                # no hysteresis for a state chosen for other sizes only: it has no claim here
                self._decide(batch_size, margin=self.margin if bucket in self._affirmed else 0.0)
            # after a dropped pause the GPU had drained: the next interval is host time alone, not a cycle either
            self._step_before = self._last_step if kept else None
        self._last_step = (now, self.current, batch_size)
        return self.current

    def forget_last_step(self) -> None:
        """The decode step just announced runs another state than the policy's (the worker's resume from steps 0):
        its cycle is not timed."""
        self._last_step = None

    def on_verify_complete(self, num_correct_drafts_per_req: list[int], batch_size: int) -> int | None:
        """Feed one verify; returns the new step count when the policy switches, else None."""
        self._since_switch += 1
        if self.current == 0:
            self._off_verifies += 1
        if self._since_switch <= self.settle:
            return None
        if self.trees:
            if self.current > 0:
                self._observed[0] += sum(1 + int(k) for k in num_correct_drafts_per_req)
                self._observed[1] += len(num_correct_drafts_per_req)
        else:
            self.acceptance.observe(self.current, num_correct_drafts_per_req)
        self._verifies += 1
        if self.costs is None:
            return None
        self._in_force_at[self.current, self.costs.bucket(batch_size)] = self._verifies
        if self._probing:  # a probe's or re-pricing's state decides after its first counted verifies
            if self._since_switch - self.settle < self._trial:
                return None
        elif self._verifies % self.update_interval:
            return None
        if self.trees:
            self._refresh_trees()
        self._probing = False
        switched = self._decide(batch_size) if self._repricing is None else self._end_repricing(batch_size)
        if self.current == 0 and switched is None and self.probe and self._off_verifies >= self._probe_every:
            return self._start_probe(batch_size)
        if self.current > 0 and switched is None and self.reprice and (stale := self._stale(batch_size)):
            return self._start_reprice(batch_size, stale)
        return switched

    def _stale(self, batch_size: int) -> list[int]:
        """The candidates other than the state in force whose price at the batch's bucket was last learnt
        ``_reprice_every`` or more counted verifies ago (never-run candidates are priced by borrowing, not stale).
        The same on every rank: it counts verifies, not cycles."""
        bucket = self.costs.bucket(batch_size)
        return [s for s in self.candidate_steps if s != self.current and (s, bucket) in self._in_force_at
                and self._price_age(s, bucket) >= self._reprice_every]

    def _price_age(self, steps: int, bucket: int) -> int:
        """Counted verifies since ``steps`` was last in force at ``bucket`` (0 if never)."""
        return self._verifies - self._in_force_at.get((steps, bucket), self._verifies)

    def _end_repricing(self, batch_size: int) -> int | None:
        """A re-pricing measures, it does not move: the best candidate stays in force only if it is worth
        ``1 + margin`` times the state the re-pricing left, which is put back in force otherwise (a near tie would
        else drift to whichever state was re-priced last). Back where it came from, the re-pricing did not pay: the
        next one waits twice as long; any other outcome resets the wait. Returns the state put in force, else None."""
        _, left, bucket = self._repricing
        self._repricing = None
        if self.costs.bucket(batch_size) != bucket:  # the batch moved on within its last verifies: an ordinary decision
            return self._decide(batch_size)
        switched = self._decide(batch_size, base=left)
        back = self.current == left
        self._reprice_every = min(2 * self._reprice_every, self.reprice[1]) if back else self.reprice[0]
        return switched

    def _start_reprice(self, batch_size: int, stale: list[int]) -> int | None:
        """Puts the stale candidate of best value (rank 0's under tensor parallelism) in force with its price at the
        batch's bucket forgotten, deciding after ``REPRICE[2]`` counted verifies; returns it."""
        choice = max(stale, key=lambda s: self.value(s, batch_size))
        if self.agree is not None:
            choice = self.agree(choice)
        if choice == self.current:
            return None
        left, bucket = self.current, self.costs.bucket(batch_size)
        age = self._price_age(choice, bucket)
        self.costs.forget(choice, batch_size)
        self._in_force_at[choice, bucket] = self._verifies
        self.reprices += 1
        logger.info("EAGLE_TRITON adaptive: re-pricing steps %d at batch %d (its price last learnt %d verifies ago)",
                    choice, batch_size, age)
        self._switch(choice, bucket)
        self._probing, self._trial, self._repricing = True, self.reprice[2], (choice, left, bucket)
        return choice

    def _start_probe(self, batch_size: int) -> int | None:
        """Steps 0 learns nothing of acceptance: after ``_probe_every`` verifies there, put the drafting state of best
        value in force for a few verifies, the acceptance evidence first aged by the verifies spent at steps 0 (as
        if they had been drafted: the estimate moves back toward the prior by what the traffic may have changed)."""
        drafting = [s for s in self.candidate_steps if s > 0]
        if not drafting:
            return None
        if not self.trees:
            self.acceptance.fade(self.acceptance.decay ** self._off_verifies)
        self._off_verifies, self._probe_at = 0, self._verifies
        choice = max(drafting, key=lambda s: self.value(s, batch_size))
        if self.agree is not None:  # rank 0 probes at this verify too: its choice is a drafting state as well
            choice = self.agree(choice)
        bucket = self.costs.bucket(batch_size)
        if self.reprice and self._price_age(choice, bucket) >= self._reprice_every:  # as stale as a re-pricing's
            self.costs.forget(choice, batch_size)  # its price learnt again
        self.probes += 1
        logger.info("EAGLE_TRITON adaptive: probing steps %d at batch %d after %d verifies at steps 0",
                    choice, batch_size, self._probe_every)
        self._switch(choice, bucket)
        self._probing, self._trial = True, self.probe[2]
        return choice

    # -- the decision --------------------------------------------------------------------------------------------

    def _decide(self, batch_size: int, margin: float | None = None, base: int | None = None) -> int | None:
        """Puts the best candidate at ``batch_size`` in force if it is worth ``1 + margin`` (default ``self.margin``)
        times ``base`` (default: the current one), else ``base`` (every rank adopting rank 0's choice); returns the
        state put in force when it switched, else None."""
        self._decided_at = bucket = self.costs.bucket(batch_size)
        margin = self.margin if margin is None else margin
        base = self.current if base is None else base
        best = self.best(batch_size)
        if best == base or self.value(best, batch_size) <= (1 + margin) * self.value(base, batch_size):
            best = base
        if self.agree is not None:
            best = self.agree(best)
        if best == self.current:
            self._affirmed.add(bucket)
            return None
        logger.info("EAGLE_TRITON adaptive: steps %d -> %d at batch %d (expected tokens %.2f -> %.2f, cycle "
                    "%.2f -> %.2f ms)", self.current, best, batch_size, self.expected_tokens(self.current),
                    self.expected_tokens(best), self.costs.cost(self.current, batch_size),
                    self.costs.cost(best, batch_size))
        self._switch(best, bucket)
        return best

    def _switch(self, steps: int, bucket: int) -> None:
        if steps == 0 and self.probe:
            # back at steps 0 within a probe's first decisions: the probe did not pay, the next one waits twice as
            # long; back later (drafting held, or the policy had left steps 0 by itself): the first wait again
            window = self.probe[2] + 2 * self.update_interval
            recent = self._probe_at is not None and self._verifies - self._probe_at <= window
            self._probe_every = min(2 * self._probe_every, self.probe[1]) if recent else self.probe[0]
            self._off_verifies, self._probe_at = 0, None
        self.current, self._since_switch, self._last_step, self._affirmed = steps, 0, None, {bucket}
        self.switches += 1

    def set_costs(self, costs: CycleCost) -> None:
        self.costs = costs

    def expected_tokens(self, steps: int) -> float:
        """Tokens one verify at ``steps`` is expected to commit per request (a tree: the rank-aware prediction
        scaled by :attr:`efficiency`)."""
        if not self.trees:
            return self.acceptance.expected_tokens(steps)
        if steps == 0:
            return 1.0
        return self._tree_prediction(steps) * self.efficiency_of(steps)

    def efficiency_of(self, steps: int) -> float:
        """The tree's observed / predicted tokens when it has been in force, else the nearest such tree's (fewer
        steps on a tie), else 1."""
        if steps in self.efficiency:
            return self.efficiency[steps]
        if not self.efficiency:
            return 1.0
        return self.efficiency[min(self.efficiency, key=lambda s: (abs(s - steps), s))]

    def _tree_prediction(self, steps: int) -> float:
        topk, n = self.trees[steps]
        return self.acceptance.expected_tokens(steps, topk, n)

    def _refresh_trees(self) -> None:
        """Before a decision: the device counts into the acceptance model, then the tree in force's observed /
        predicted tokens into its efficiency (EMA weight 0.3 from its first ratio, kept within 0.5..1.2). Before the
        first counts arrive the prediction is the prior's, and no efficiency is learnt from it."""
        counts = self.evidence.snapshot() if self.evidence is not None else None
        tokens, requests = self._observed
        self._observed = [0.0, 0]
        if counts is None:
            return
        self.acceptance.load(*counts)
        if self.current > 0 and requests:
            ratio = (tokens / requests) / self._tree_prediction(self.current)
            old = self.efficiency.get(self.current, ratio)
            self.efficiency[self.current] = min(max(0.7 * old + 0.3 * ratio, 0.5), 1.2)

    def value(self, steps: int, batch_size: int) -> float:
        """Expected committed tokens per ms per request."""
        return self.expected_tokens(steps) / self.costs.cost(steps, batch_size)

    def best(self, batch_size: int) -> int:
        return max(self.candidate_steps, key=lambda s: self.value(s, batch_size))

    def report(self) -> dict:
        """For ``/server_info``: the estimates the decisions rest on."""
        depths = range(1, max(self.candidate_steps) + 1)
        out = {"policy": "cost", "steps": self.current, "switches": self.switches, "probes": self.probes,
               "reprices": self.reprices}
        if self.trees:
            out["rank_rates"] = [[round(self.acceptance.rate(d, r), 3) for r in range(self.acceptance.max_rank)]
                                 for d in depths]
            out["efficiency"] = {str(k): round(v, 3) for k, v in sorted(self.efficiency.items())}
            out["expected_tokens"] = {str(s): round(self.expected_tokens(s), 3) for s in self.candidate_steps}
        else:
            out["depth_rates"] = [round(self.acceptance.rate(d), 3) for d in depths]
        if self.costs is not None:
            out["replay_ms"] = {f"{s},{bs}": round(ms, 3) for (s, bs), ms in sorted(self.costs.replay.items())}
            out["rest_ms"] = {f"{s},{bs}": round(ms, 3) for (s, bs), ms in sorted(self.costs.rest.items())}
            out["rest_spread_ms"] = {f"{s},{bs}": [round(low, 3), round(high, 3), n]
                                     for (s, bs), (low, high, n) in sorted(self.costs.spread().items())}
            # per (steps, bucket): cycles timed and how many of them were dropped as pauses (not in the price)
            out["timed_dropped"] = {f"{s},{bs}": [n, self.costs.dropped.get((s, bs), 0)]
                                    for (s, bs), n in sorted(self.costs.timed.items())}
        return out


def captured_graph(runner, batch_size: int, tokens_per_req: int):
    """The CUDA graph ``runner`` (an SGLang graph runner on the full-graph backend, one with ``graph_for(batch
    size)`` such as :class:`~sgl_eagle_triton.row_graphs.RowGraphs`, or None) captured for ``batch_size`` requests
    (keyed by requests, or by tokens in SGLang's ragged verify mode), or None."""
    if runner is None:
        return None
    if hasattr(runner, "graph_for"):
        return runner.graph_for(batch_size)
    graphs = getattr(getattr(runner, "backend", None), "_graphs", None) or {}
    for size in (batch_size, batch_size * tokens_per_req):
        graph = graphs.get(runner._make_graph_key(size))
        if graph is not None:
            return graph
    return None


def cuda_replay_ms(graphs, repeats: int = 10) -> float:
    """Median ms of replaying ``graphs`` one after another (CUDA events), after a warm-up replay."""
    import torch

    times = []
    for i in range(repeats + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for graph in graphs:
            graph.replay()
        end.record()
        end.synchronize()
        if i:
            times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def replay_ms(graph_runners, batch_sizes: list[int], tokens_per_req: int, measure=cuda_replay_ms) -> dict[int, float]:
    """{batch size: ms} of replaying, one after another, the CUDA graph each of ``graph_runners`` captured at that
    batch size (:func:`captured_graph`; a runner without it adds nothing; ``measure`` times a list of graphs). The
    graphs replay on the buffers as the last replay left them (the padding slot for KV writes, short contexts):
    the weights' cost, not long prefixes'."""
    out = {}
    for bs in batch_sizes:
        graphs = [g for r in graph_runners if (g := captured_graph(r, bs, tokens_per_req)) is not None]
        if graphs:
            out[bs] = measure(graphs)
    return out
