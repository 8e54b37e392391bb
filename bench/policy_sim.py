"""The cost-aware policy (sgl_eagle_triton.adaptive.CostAwarePolicy) driven through a simulated host-bound server, on
the CPU: which step counts it puts in force and the tokens per millisecond it gets, for a traffic of requests of
given acceptance, with or without a fading of its acceptance evidence while steps 0 is in force.

    python -m bench.policy_sim                      # the table of docs/off-step-design.md section 6
    python -m bench.policy_sim --fade 0.125         # one decay every eight steps at 0

Model (one request at a time, batch 1): a cycle at steps 0 costs ``OFF_MS``, at steps s ``draft_ms(s)`` (the trained
tiny pair's host-bound cycles on one H200: 1.7 ms and 3.4-3.6 ms); a request's drafts are accepted depth by depth
with its own chance; the policy sees every cycle's time and every verify's accepted drafts, as on a server. Fading:
at each verify while steps 0 is in force the policy's depth counts are multiplied by ``decay ** fade`` (its
forgetting per drafted verify is ``decay``), so that its estimate drifts back to the prior and it tries drafting again.
"""

from __future__ import annotations

import argparse
import random

from sgl_eagle_triton.adaptive import CostAwarePolicy, CycleCost

CANDIDATES = [0, 1, 3, 5, 7]
OFF_MS = 1.7
TRAFFIC = {  # per-request acceptance chances, in order
    "mixed": [0.2, 0.85] * 10, "easy": [0.85] * 20, "hard": [0.3] * 20, "useless": [0.02] * 20}


def draft_ms(steps: int) -> float:
    return 3.0 + 0.1 * steps


def simulate(rates: list[float], fade: float | None, tokens_per_request: int = 200, seed: int = 0) -> dict:
    """Serves one request per acceptance chance in ``rates``; returns ``tok_per_ms`` and ``steps_in_force``."""
    rng, now = random.Random(seed), [0.0]
    policy = CostAwarePolicy(CANDIDATES, 3, clock=lambda: now[0])
    policy.set_costs(CycleCost({(s, 1): 0.1 + 0.03 * s for s in CANDIDATES}))
    tokens, in_force = 0, {}
    for rate in rates:
        left = tokens_per_request
        while left > 0:
            steps = policy.get_steps_for_batch(1)
            in_force[steps] = in_force.get(steps, 0) + 1
            accepted = 0
            while accepted < steps and rng.random() < rate:
                accepted += 1
            now[0] += (draft_ms(steps) if steps else OFF_MS) / 1e3
            left -= accepted + 1
            tokens += accepted + 1
            if fade is not None and policy.current == 0:
                policy.acceptance.fade(policy.acceptance.decay ** fade)
            policy.on_verify_complete([accepted], 1)
    return {"tok_per_ms": tokens / (now[0] * 1e3), "steps_in_force": dict(sorted(in_force.items()))}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fade", type=float, nargs="*", default=[1.0, 0.125],
                        help="fades to compare with none (decays per verify at steps 0)")
    args = parser.parse_args(argv)
    print("| traffic | fade | tok/ms | / no fade | steps in force |\n|---|---|---|---|---|")
    for name, rates in TRAFFIC.items():
        base = simulate(rates, None)
        for fade in [None, *args.fade]:
            r = base if fade is None else simulate(rates, fade)
            print(f"| {name} | {fade if fade is not None else 'none'} | {r['tok_per_ms']:.3f} | "
                  f"{r['tok_per_ms'] / base['tok_per_ms']:.3f} | {r['steps_in_force']} |")


if __name__ == "__main__":
    main()
