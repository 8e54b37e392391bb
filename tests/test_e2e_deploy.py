"""End to end under the flags real deployments pass: for each flag set, servers without speculation, with stock
EAGLE3 and with EAGLE_TRITON serve the trained tiny pair with the same flags, and answer the code prompts through
``/generate`` (one by one and all at once, greedy, deterministic inference; ``tp2_custom_ar`` without it, so that
SGLang's custom all-reduce runs).

Pass: EAGLE_TRITON is tie-aware equal to no speculation under the same flags (tests/lossless.py; under an FP8
KV cache, where stock EAGLE3 itself departs from no speculation, ours departs at no other place; without
deterministic inference no more often than stock), accepts at least ``tests.e2e.accept_share`` of stock's
accept length (95 % where our verify attention ran, else 98 %), its ``/server_info`` report shows our kernels ran
with no error; token-for-token equality with stock is reported. ``E2E_REPORT_DIR`` receives a JSON per flag set.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.e2e import (
    accept_share,
    e2e_server,
    lean_draft_problem,
    lean_extend_env,
    lean_extend_problem,
    require_gpus,
    serve_concurrently,
    serve_generate,
    tensor_parallel,
    verdicts,
)
from tests.tiny_models import TRAINED_PAIR

pytestmark = [pytest.mark.e2e, pytest.mark.gpu]

TARGET, DRAFT = str(TRAINED_PAIR / "target"), str(TRAINED_PAIR / "eagle3")
# flag set -> its arguments and the trees served under it (paged KV: a chain and a tree with topk > 1, which
# SGLang 0.5.17 runs with paged KV on the triton backend; fp8_e4m3's chain: the lean draft extend on an FP8 pool)
DEPLOYMENTS = {
    "page16": (["--page-size", "16"], [(5, 1, 6), (5, 4, 16)]),
    "page64": (["--page-size", "64"], [(5, 1, 6), (5, 4, 16)]),
    "fp8_e4m3": (["--kv-cache-dtype", "fp8_e4m3"], [(5, 1, 6), (5, 4, 16)]),
    "fp8_e5m2": (["--kv-cache-dtype", "fp8_e5m2"], [(5, 4, 16)]),
    "fp16": (["--dtype", "float16"], [(5, 4, 16)]),
    "flashinfer": (["--attention-backend", "flashinfer"], [(5, 1, 6), (5, 4, 16)]),
    "dp2": (["--dp", "2"], [(5, 1, 6), (5, 4, 16)]),  # two data-parallel replicas: a machine of two GPUs
    "tp2": (["--tp", "2"], [(5, 1, 6), (5, 4, 16)]),  # tensor parallelism on SGLang's TP group (issue 13)
    # the same without deterministic inference, which turns SGLang's custom all-reduce off at TP > 1: the
    # drafter's all-reduces through SGLang's communicator then take the custom all-reduce, as in deployments
    "tp2_custom_ar": (["--tp", "2"], [(5, 4, 16)]),
}
GPUS_NEEDED = {"dp2": 2}
# Under an FP8 KV cache SGLang's own EAGLE3 departs from no speculation by more than a bf16 near-tie at a few
# places (H200, 2026-11-26: 2 at fp8_e4m3, 4 at fp8_e5m2, of 32 outputs); EAGLE_TRITON departed at exactly the
# same ones. There, ours may depart only where stock does (as lossless as SGLang's speculative path). The
# rescoring's control (no-spec's own tokens rescored by a prefill) is no bf16 near-tie there either: no-spec's
# decode reads FP8 keys and values, the prefill's attention its own bf16 ones (H200, 2026-11-29, fp8_e4m3: no-spec
# tokens up to 1.625 below the rescored best, above the 1.25 ceiling); the rescoring's bound is then that control's.
STOCK_DEPARTS = {"fp8_e4m3", "fp8_e5m2"}
# Without deterministic inference a target's logits depend on the batch they ran in, so departures beyond a bf16
# near-tie can happen at places that differ between servers: there ours may depart no more often than stock does
# (a first-run criterion, not yet measured on a GPU).
NONDETERMINISTIC = {"tp2_custom_ar"}


@pytest.mark.parametrize("deployment", list(DEPLOYMENTS))
def test_eagle_triton_under_deployment_flags(deployment, tmp_path):
    flags, trees = DEPLOYMENTS[deployment]
    require_gpus(GPUS_NEEDED.get(deployment, 1), deployment)
    env = tensor_parallel(2)[1] if deployment.startswith("tp2") else None
    deterministic = deployment not in NONDETERMINISTIC
    servers = {"nospec": e2e_server(f"{deployment}-nospec", TARGET, flags, tmp_path, env=env,
                                    deterministic=deterministic)}
    for steps, topk, n in trees:
        spec = [*flags, "--speculative-draft-model-path", DRAFT, "--speculative-num-steps", str(steps),
                "--speculative-eagle-topk", str(topk), "--speculative-num-draft-tokens", str(n)]
        server_env = lean_extend_env(env, served=topk == 1 and not deployment.startswith("tp"))
        for algo in ("EAGLE3", "EAGLE_TRITON"):
            servers[algo, n] = e2e_server(f"{deployment}-{algo}-{steps}-{topk}-{n}", TARGET,
                                          ["--speculative-algorithm", algo, *spec], tmp_path, env=server_env,
                                          deterministic=deterministic)
    results, infos = serve_concurrently(servers, serve_generate, [("EAGLE_TRITON", n) for _, _, n in trees])
    reports = {n: infos["EAGLE_TRITON", n]["eagle_triton"] for _, _, n in trees}

    summary = {"deployment": deployment, "flags": flags, "trees": {}}
    for steps, topk, n in trees:
        ours, stock = results["EAGLE_TRITON", n], results["EAGLE3", n]
        summary["trees"][f"{steps},{topk},{n}"] = {
            "accept_length": {"eagle_triton": ours["accept_length"], "stock": stock["accept_length"]},
            "vs_nospec": {"eagle_triton": verdicts(ours, results["nospec"]),
                          "stock": verdicts(stock, results["nospec"])},
            "equal_to_stock": {k: ours[k] == stock[k] for k in ("generate", "generate_concurrent")},
            "kernels_ran": reports[n]["ran"],
        }
    print(json.dumps(summary, indent=1))
    if os.environ.get("E2E_REPORT_DIR"):
        with open(os.path.join(os.environ["E2E_REPORT_DIR"], f"deploy-{deployment}.json"), "w") as f:
            json.dump(summary, f, indent=1)
    for (_, topk, n), (key, entry) in zip(trees, summary["trees"].items(), strict=True):
        control = [b for b in entry["vs_nospec"]["stock"]["bugs"] if b[0] == "rescored-control"]
        assert deployment in STOCK_DEPARTS or not control, entry["vs_nospec"]  # FP8 KV: no ceiling on the control
        ours, stock = ({tuple(b[:3]) for b in entry["vs_nospec"][s]["bugs"]} for s in ("eagle_triton", "stock"))
        if deployment in NONDETERMINISTIC:
            assert len(ours) <= len(stock), (key, entry["vs_nospec"])
        else:
            allowed = stock if deployment in STOCK_DEPARTS else set()
            assert ours <= allowed, (key, entry["vs_nospec"])
        accept = entry["accept_length"]
        assert accept["eagle_triton"] >= accept_share(reports[n]) * accept["stock"], (key, accept)
        assert reports[n]["errors"] == [] and reports[n]["ran"].get("triton fused drafter", 0) > 0, reports[n]
        # the lean draft phase on one GPU (each DP replica's), SGLang's under TP and for paged trees
        paged = "--page-size" in flags and topk > 1
        assert lean_draft_problem(reports[n], one_gpu=not deployment.startswith("tp"), paged_tree=paged) is None, key
        # the lean draft extend for chains on one GPU (paged and FP8 pools included)
        assert lean_extend_problem(reports[n], one_gpu=not deployment.startswith("tp"),
                                   chain=topk == 1) is None, (key, reports[n]["kernels"].get("draft extend"))
