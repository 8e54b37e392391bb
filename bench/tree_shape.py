"""How deep EAGLE's draft trees grow with the draft's confidence, and what the tree-aware simulated acceptance
credits them with: a Monte Carlo over i.i.d. draft logits (no GPU).

Per tree: the root's top-k of a softmax over ``vocab`` logits of std ``logit_std``; each step every frontier node
draws its own top-k, and the k best by cumulative score (the product of the probabilities on the path) form the
next frontier; the tree keeps the ``n - 1`` best nodes of all steps (SGLang's ``select_top_k_tokens`` /
``organize_draft_results``). The walk of :mod:`sgl_eagle_triton.simulated_acceptance` then accepts the child of
sibling rank ``r`` (among the kept children, in the draft's order) at level ``d`` with chance
``rank_probs[r] * depth_decay ** d``: the expected tokens per verify are ``1 + sum over kept nodes of the product of
those chances along the path``.

    python -m bench.tree_shape [--trials 20]       # the table bench/README.md quotes
"""

from __future__ import annotations

import argparse

import numpy as np

from sgl_eagle_triton.simulated_acceptance import PROFILES


def draft_top(rng, logit_std: float, topk: int, vocab: int) -> np.ndarray:
    """The top-k probabilities (descending) of a softmax over ``vocab`` logits of std ``logit_std``."""
    z = rng.standard_normal(vocab) * logit_std
    p = np.exp(z - z.max())
    return np.sort(p / p.sum())[::-1][:topk]


def tree(rng, steps: int, topk: int, n: int, logit_std: float, vocab: int = 32000) -> list[tuple[int, ...]]:
    """The kept nodes of one draft tree, each as its path of sibling ranks in the draft's order."""
    nodes, frontier = [], [(1.0, ())]
    for _ in range(steps):
        children = [(score * p, path + (r,)) for score, path in frontier
                    for r, p in enumerate(draft_top(rng, logit_std, topk, vocab))]
        nodes += children
        frontier = sorted(children, key=lambda c: -c[0])[:topk]
    return [path for _, path in sorted(nodes, key=lambda c: -c[0])[:n - 1]]


def expected_tokens(paths: list[tuple[int, ...]], rank_probs: list[float], depth_decay: float) -> float:
    """Tokens per verify under the walk: 1 + the chance of reaching and accepting each kept node."""
    kept = set(paths)
    total = 1.0
    for path in paths:
        chance = 1.0
        for depth in range(len(path)):
            if depth and path[:depth] not in kept:  # an orphan (its parent pruned): never reached
                chance = 0.0
                break
            siblings = sorted(p[depth] for p in kept if len(p) == depth + 1 and p[:depth] == path[:depth])
            rank = siblings.index(path[depth])
            chance *= rank_probs[rank] * depth_decay**depth if rank < len(rank_probs) else 0.0
        total += chance
    return total


def shape_stats(steps: int, topk: int, n: int, logit_std: float, trials: int, profile: str = "llama31-8b-eagle3",
                seed: int = 0) -> tuple[float, float]:
    """``(mean expected tokens, mean depth)`` of ``trials`` trees of shape (steps, topk, n)."""
    rng, p = np.random.default_rng(seed), PROFILES[profile]
    trees = [tree(rng, steps, topk, n, logit_std) for _ in range(trials)]
    return (float(np.mean([expected_tokens(t, p["rank_probs"], p["depth_decay"]) for t in trees])),
            float(np.mean([max(len(path) for path in t) for t in trees])))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args(argv)
    print("| logit std | shape | tokens per verify | depth |\n|---|---|---|---|")
    for std in (1.28, 3.0, 5.0, 7.0):
        for shape in ((8, 8, 64), (5, 8, 32), (4, 4, 16), (5, 1, 6), (3, 1, 4)):
            tokens, depth = shape_stats(*shape, std, args.trials)
            print(f"| {std} | {','.join(map(str, shape))} | {tokens:.2f} | {depth:.1f} |")


if __name__ == "__main__":
    main()
