"""Benchmark-only simulated acceptance that depends on the tree: for real model shapes with dummy weights, which
accept nothing. Every verify's result is replaced by :func:`sgl_eagle_triton.kernels.simulated_walk` over the tree
that was really drafted and verified (so every cost is real), with a profile's chance that the target picks the
draft candidate of each sibling rank at each depth.

Enabled only with both ``SGLANG_EAGLE_TRITON_SIMULATED_ACCEPTANCE=<profile>`` and ``SGLANG_EAGLE_TRITON_BENCHMARK=1``
(EAGLE_TRITON refuses the first without the second at start); then it applies to every EAGLE server of the process,
stock EAGLE / EAGLE3 included (the plugin wraps SGLang's ``eagle_sample``, the EAGLE_TRITON worker ours, with
:func:`wrap`), so systems compare under one acceptance. Outputs are then meaningless (accepted draft tokens, a
fixed bonus token). Profiles and sources: bench/README.md.
"""

from __future__ import annotations

import functools
import os

import torch

from sgl_eagle_triton.adaptive import chain_tokens

PROFILE_ENV = "SGLANG_EAGLE_TRITON_SIMULATED_ACCEPTANCE"
BENCHMARK_ENV = "SGLANG_EAGLE_TRITON_BENCHMARK"
# rank_probs[r]: the chance that the target's next token is the draft's candidate of sibling rank r at depth 1;
# each deeper level multiplies them by depth_decay. Provisional calibration (bench/README.md): a chain of 5
# commits 3.70 tokens per verify, an 8-deep tree with two candidates per level about 5.
PROFILES = {
    "llama31-8b-eagle3": dict(rank_probs=[0.82, 0.06, 0.025, 0.015, 0.01, 0.007, 0.005, 0.004], depth_decay=0.98),
}
LEVELS = 16


def profile_name() -> str | None:
    return os.environ.get(PROFILE_ENV) or None


def misconfigured() -> str | None:
    """Why the environment's simulated acceptance cannot run (for the refusal at start), or None."""
    name = profile_name()
    if name is None:
        return None
    if name not in PROFILES:
        return f"{PROFILE_ENV}={name!r} (profiles: {', '.join(PROFILES)})"
    if os.environ.get(BENCHMARK_ENV) != "1":
        return f"{PROFILE_ENV} without {BENCHMARK_ENV}=1 (simulated acceptance makes outputs meaningless)"
    if float(os.environ.get("SGLANG_SIMULATE_ACC_LEN") or -1) > 0:
        return f"{PROFILE_ENV} together with SGLANG_SIMULATE_ACC_LEN (one acceptance model at a time)"
    return None


def active() -> bool:
    return profile_name() is not None and misconfigured() is None


def cumulative_probs(rank_probs: list[float], depth_decay: float, levels: int = LEVELS) -> torch.Tensor:
    """``cum_prob`` [levels, ranks] fp32: at level ``d`` rank ``r`` is picked with ``rank_probs[r] *
    depth_decay ** d``, cumulated over ranks (capped at 1)."""
    p = torch.tensor(rank_probs, dtype=torch.float64)
    scale = depth_decay ** torch.arange(levels, dtype=torch.float64)
    return (p[None, :] * scale[:, None]).cumsum(-1).clamp(max=1.0).float()


def expected_chain_tokens(rank_probs: list[float], depth_decay: float, steps: int) -> float:
    """Tokens a chain of ``steps`` drafts commits per verify under a profile (the bonus included)."""
    return chain_tokens(rank_probs[0] * depth_decay**d for d in range(steps))


@functools.lru_cache(maxsize=8)
def _table(name: str, device: str) -> torch.Tensor:
    return cumulative_probs(**PROFILES[name]).to(device)


def apply(verify_input, batch, result):
    """``eagle_sample``'s ``(predict, accept_lens, accept_index)`` replaced by the simulated walk of the batch's
    verify tree (idle batches unchanged)."""
    from sgl_eagle_triton.kernels.simulated_walk import simulated_walk

    predict, accept_lens, accept_index = result
    if batch.forward_mode.is_idle() or predict.numel() == 0:
        return result
    bs, n = len(batch.seq_lens), verify_input.draft_token_num
    device = predict.device
    new_predict = torch.zeros_like(predict)
    new_index = torch.full_like(accept_index, -1)
    num_correct = torch.empty(bs, dtype=torch.int32, device=device)
    coins = torch.rand(accept_index.shape, dtype=torch.float32, device=device)
    simulated_walk(new_predict, new_index, num_correct, verify_input.draft_token.reshape(bs, n).contiguous(),
                   verify_input.retrieve_index.contiguous(), verify_input.retrieve_next_token.contiguous(),
                   verify_input.retrieve_next_sibling.contiguous(), coins, _table(profile_name(), str(device)))
    return new_predict, (num_correct + 1).to(accept_lens.dtype), new_index


def compile_walk(shapes, device) -> None:
    """Benchmark mode: :func:`apply`'s walk run on one and on two chains of each ``(draft tokens n, steps)``, so that
    Triton compiles it before serving (as :func:`sgl_eagle_triton.verify.compile_verify_kernels`)."""
    from sgl_eagle_triton.kernels.simulated_walk import simulated_walk
    from sgl_eagle_triton.kernels.tree_rows import start_up_chains, verify_outputs

    if not active():
        return
    table = _table(profile_name(), str(torch.device(device)))
    for n, steps, requests, tree in start_up_chains(shapes, device):
        simulated_walk(*verify_outputs(requests, n, steps, device), *tree,
                       torch.rand(requests, steps + 1, device=device), table)


def wrap(eagle_sample):
    """``eagle_sample`` (SGLang's, or ours) followed by :func:`apply`: the verify of a server in benchmark mode."""

    @functools.wraps(eagle_sample)
    def simulated(verify_input, batch, *args, **kwargs):
        return apply(verify_input, batch, eagle_sample(verify_input, batch, *args, **kwargs))

    simulated.sgl_eagle_triton_simulated = True
    return simulated
