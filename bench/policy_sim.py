"""The cost-aware policy (sgl_eagle_triton.adaptive.CostAwarePolicy) driven through a simulated host-bound server, on
the CPU: which step counts it puts in force and the tokens per millisecond it gets, for a traffic of requests of
given acceptance, with steps 0's probe (adaptive.PROBE) or other probe settings, against no probe.

    python -m bench.policy_sim                          # the table of docs/off-step-design.md section 6
    python -m bench.policy_sim --probe 16,256,4 64,1024,4
    python -m bench.policy_sim --cap --cold 100,1.5 --noise 0.15   # pricing by deeper states' cycles, on and off
    python -m bench.policy_sim --reprice --cold 100,1.5 --noise 0.15   # re-pricing stale prices, on and off

Model (one request at a time, batch 1): a cycle at steps 0 costs ``OFF_MS``, at steps s ``draft_ms(s)`` (the trained
tiny pair's host-bound cycles on one H200: 1.7 ms and 3.0-3.7 ms); a request's drafts are accepted depth by depth
with its own chance; the policy sees every cycle's time and every verify's accepted drafts, as on a server. A switch
from steps 0 to a drafting state costs one more cycle at steps 0 (the worker's resume step). ``oracle``: each request
served in whichever single state is fastest for it. ``--cold N,F``: the server's first N cycles cost F times as much
(a server's first requests: one H200 priced the chain of 3 at 4.9-5.1 ms from them, 3.2 ms later); ``--noise S``:
every cycle times a log-normal factor of sigma S. ``--cap``: compare the price cap by deeper states' cycles
(adaptive.CycleCost.cap_by_deeper) with each state's own price alone, instead of probe settings; ``--reprice``:
re-pricing stale prices (adaptive.REPRICE) against none; ``--draft-ms B,S``: a drafting cycle of B + S x steps ms
(the tiny pair's static chain of 3 ran 2.5 ms a cycle and the cost policy's chain of 7 3.05 ms on one H200:
``--draft-ms 2.09,0.1375``).
"""

from __future__ import annotations

import argparse
import random

from sgl_eagle_triton.adaptive import PROBE, REPRICE, CostAwarePolicy, CycleCost, chain_tokens

CANDIDATES = [0, 1, 3, 5, 7]
OFF_MS = 1.7
TRAFFIC = {  # per-request acceptance chances, in order
    "mixed": [0.2, 0.85] * 10, "hard, then easy": [0.3] * 10 + [0.85] * 10, "easy": [0.85] * 20,
    "hard": [0.3] * 20, "useless": [0.02] * 20,
    "tiny pair": [0.6] * 20}  # the trained tiny pair's depth rates at batch 1 (0.55-0.67)


DRAFT_MS = (3.0, 0.1)  # a drafting cycle: base + per step (ms); --draft-ms


def draft_ms(steps: int) -> float:
    return DRAFT_MS[0] + DRAFT_MS[1] * steps


def cycle_ms(steps: int) -> float:
    return draft_ms(steps) if steps else OFF_MS


def oracle_tok_per_ms(rates: list[float]) -> float:
    """Tokens per ms with every request in the state of most tokens per ms for its chance."""
    ms = sum(1 / max(chain_tokens([rate] * s) / cycle_ms(s) for s in CANDIDATES) for rate in rates)
    return len(rates) / ms


def simulate(rates: list[float], probe, tokens_per_request: int = 200, seed: int = 0, cap: bool = True,
             cold: tuple[int, float] = (0, 1.0), noise: float = 0.0, reprice=REPRICE) -> dict:
    """Serves one request per acceptance chance in ``rates``; returns ``tok_per_ms``, ``steps_in_force`` and
    ``probes``. ``cap``: CycleCost.cap_by_deeper; ``cold``: (cycles, factor) at the server's start; ``noise``: the
    sigma of every cycle's log-normal factor; ``reprice``: adaptive.REPRICE's settings, None for none."""
    rng, now = random.Random(seed), [0.0]
    policy = CostAwarePolicy(CANDIDATES, 3, clock=lambda: now[0], probe=probe, reprice=reprice)
    policy.set_costs(CycleCost({(s, 1): 0.1 + 0.03 * s for s in CANDIDATES}, cap_by_deeper=cap))
    tokens, in_force, last, cycles = 0, {}, 3, 0

    def spend(ms: float) -> None:
        nonlocal cycles
        factor = cold[1] if cycles < cold[0] else 1.0
        cycles += 1
        now[0] += ms * factor * (rng.lognormvariate(0.0, noise) if noise else 1.0) / 1e3

    for rate in rates:
        left = tokens_per_request
        while left > 0:
            steps = policy.get_steps_for_batch(1)
            if last == 0 and steps > 0:  # the resume step
                spend(OFF_MS)
            last = steps
            in_force[steps] = in_force.get(steps, 0) + 1
            accepted = 0
            while accepted < steps and rng.random() < rate:
                accepted += 1
            spend(cycle_ms(steps))
            left -= accepted + 1
            tokens += accepted + 1
            policy.on_verify_complete([accepted], 1)
    return {"tok_per_ms": tokens / (now[0] * 1e3), "steps_in_force": dict(sorted(in_force.items())),
            "probes": policy.probes + policy.reprices}


def parse_probe(text: str) -> tuple[int, int, int]:
    first, longest, verifies = (int(v) for v in text.split(","))
    return first, longest, verifies


def parse_cold(text: str) -> tuple[int, float]:
    cycles, factor = text.split(",")
    return int(cycles), float(factor)


def main(argv=None) -> None:
    global DRAFT_MS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probe", type=parse_probe, nargs="*", default=[PROBE],
                        help="probe settings to compare with none: FIRST,LONGEST,VERIFIES (default adaptive.PROBE)")
    parser.add_argument("--seeds", type=int, default=5, help="runs per traffic (their mean)")
    parser.add_argument("--cap", action="store_true",
                        help="compare the price cap by deeper states' cycles with own prices alone (probe: PROBE)")
    parser.add_argument("--reprice", action="store_true",
                        help="compare re-pricing stale prices (adaptive.REPRICE) with none (probe: PROBE)")
    parser.add_argument("--draft-ms", type=lambda text: tuple(float(v) for v in text.split(",")), default=DRAFT_MS,
                        help="BASE,PER_STEP ms of a drafting cycle (default %(default)s)")
    parser.add_argument("--cold", type=parse_cold, default=(0, 1.0), help="CYCLES,FACTOR at the server's start")
    parser.add_argument("--noise", type=float, default=0.0, help="sigma of each cycle's log-normal factor")
    args = parser.parse_args(argv)
    DRAFT_MS = args.draft_ms
    # variants: (label, probe, cap, reprice); the first is the base of the "/ base" column
    if args.cap:
        variants = [("own prices", PROBE, False, REPRICE), ("cap by deeper", PROBE, True, REPRICE)]
    elif args.reprice:
        variants = [("no re-pricing", PROBE, True, None), ("re-pricing", PROBE, True, REPRICE)]
    else:
        variants = [("none", None, True, REPRICE), *((",".join(map(str, p)), p, True, REPRICE) for p in args.probe)]
    print(f"| traffic | {'pricing' if args.cap or args.reprice else 'probe'} | tok/ms | / {variants[0][0]} | / oracle "
          "| probes + re-pricings | steps in force (seed 0) |\n|---|---|---|---|---|---|---|")
    for name, rates in TRAFFIC.items():
        oracle = oracle_tok_per_ms(rates)
        runs = {label: [simulate(rates, probe, seed=seed, cap=cap, cold=args.cold, noise=args.noise, reprice=reprice)
                        for seed in range(args.seeds)] for label, probe, cap, reprice in variants}
        base = sum(r["tok_per_ms"] for r in runs[variants[0][0]]) / args.seeds
        for label, results in runs.items():
            tok = sum(r["tok_per_ms"] for r in results) / args.seeds
            probes = sum(r["probes"] for r in results) / args.seeds
            print(f"| {name} | {label} | {tok:.3f} | {tok / base:.3f} | {tok / oracle:.3f} | {probes:.0f} | "
                  f"{results[0]['steps_in_force']} |")


if __name__ == "__main__":
    main()
