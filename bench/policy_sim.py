"""The cost-aware policy (sgl_eagle_triton.adaptive.CostAwarePolicy) driven through a simulated host-bound server, on
the CPU: which step counts it puts in force and the tokens per millisecond it gets, for a traffic of requests of
given acceptance, with steps 0's probe (adaptive.PROBE) or other probe settings, against no probe.

    python -m bench.policy_sim                          # the table of docs/off-step-design.md section 6
    python -m bench.policy_sim --probe 16,256,4 64,1024,4

Model (one request at a time, batch 1): a cycle at steps 0 costs ``OFF_MS``, at steps s ``draft_ms(s)`` (the trained
tiny pair's host-bound cycles on one H200: 1.7 ms and 3.0-3.7 ms); a request's drafts are accepted depth by depth
with its own chance; the policy sees every cycle's time and every verify's accepted drafts, as on a server. A switch
from steps 0 to a drafting state costs one more cycle at steps 0 (the worker's resume step). ``oracle``: each request
served in whichever single state is fastest for it.
"""

from __future__ import annotations

import argparse
import random

from sgl_eagle_triton.adaptive import PROBE, CostAwarePolicy, CycleCost, chain_tokens

CANDIDATES = [0, 1, 3, 5, 7]
OFF_MS = 1.7
TRAFFIC = {  # per-request acceptance chances, in order
    "mixed": [0.2, 0.85] * 10, "hard, then easy": [0.3] * 10 + [0.85] * 10, "easy": [0.85] * 20,
    "hard": [0.3] * 20, "useless": [0.02] * 20}


def draft_ms(steps: int) -> float:
    return 3.0 + 0.1 * steps


def cycle_ms(steps: int) -> float:
    return draft_ms(steps) if steps else OFF_MS


def oracle_tok_per_ms(rates: list[float]) -> float:
    """Tokens per ms with every request in the state of most tokens per ms for its chance."""
    ms = sum(1 / max(chain_tokens([rate] * s) / cycle_ms(s) for s in CANDIDATES) for rate in rates)
    return len(rates) / ms


def simulate(rates: list[float], probe, tokens_per_request: int = 200, seed: int = 0) -> dict:
    """Serves one request per acceptance chance in ``rates``; returns ``tok_per_ms``, ``steps_in_force`` and
    ``probes``."""
    rng, now = random.Random(seed), [0.0]
    policy = CostAwarePolicy(CANDIDATES, 3, clock=lambda: now[0], probe=probe)
    policy.set_costs(CycleCost({(s, 1): 0.1 + 0.03 * s for s in CANDIDATES}))
    tokens, in_force, last = 0, {}, 3
    for rate in rates:
        left = tokens_per_request
        while left > 0:
            steps = policy.get_steps_for_batch(1)
            if last == 0 and steps > 0:  # the resume step
                now[0] += OFF_MS / 1e3
            last = steps
            in_force[steps] = in_force.get(steps, 0) + 1
            accepted = 0
            while accepted < steps and rng.random() < rate:
                accepted += 1
            now[0] += cycle_ms(steps) / 1e3
            left -= accepted + 1
            tokens += accepted + 1
            policy.on_verify_complete([accepted], 1)
    return {"tok_per_ms": tokens / (now[0] * 1e3), "steps_in_force": dict(sorted(in_force.items())),
            "probes": policy.probes}


def parse_probe(text: str) -> tuple[int, int, int]:
    first, longest, verifies = (int(v) for v in text.split(","))
    return first, longest, verifies


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probe", type=parse_probe, nargs="*", default=[PROBE],
                        help="probe settings to compare with none: FIRST,LONGEST,VERIFIES (default adaptive.PROBE)")
    parser.add_argument("--seeds", type=int, default=5, help="runs per traffic (their mean)")
    args = parser.parse_args(argv)
    print("| traffic | probe | tok/ms | / no probe | / oracle | probes | steps in force (seed 0) |\n"
          "|---|---|---|---|---|---|---|")
    for name, rates in TRAFFIC.items():
        oracle = oracle_tok_per_ms(rates)
        runs = {probe: [simulate(rates, probe, seed=seed) for seed in range(args.seeds)]
                for probe in [None, *args.probe]}
        base = sum(r["tok_per_ms"] for r in runs[None]) / args.seeds
        for probe, results in runs.items():
            tok = sum(r["tok_per_ms"] for r in results) / args.seeds
            probes = sum(r["probes"] for r in results) / args.seeds
            label = ",".join(map(str, probe)) if probe else "none"
            print(f"| {name} | {label} | {tok:.3f} | {tok / base:.3f} | {tok / oracle:.3f} | {probes:.0f} | "
                  f"{results[0]['steps_in_force']} |")


if __name__ == "__main__":
    main()
