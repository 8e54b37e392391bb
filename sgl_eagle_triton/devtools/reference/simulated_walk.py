"""Plain-PyTorch twin of ``kernels.simulated_walk``: the benchmark-only simulated verification walk."""



def simulated_walk(predicts, accept_index, accept_token_num, candidates, retrieve_index, retrieve_next_token,
                   retrieve_next_sibling, coins, cum_prob, bonus_token: int = 100) -> None:
    """Same arguments and results as ``sgl_eagle_triton.kernels.simulated_walk.simulated_walk``: per request, from
    the root, level ``m`` draws coin ``coins[b, m]`` and accepts the first child (in sibling order) of rank ``r``
    with ``coin < cum_prob[min(m, L - 1), min(r, K - 1)]``; at most ``S`` levels."""
    bs, _ = candidates.shape
    num_spec = accept_index.shape[1]
    levels, ranks = cum_prob.shape
    for b in range(bs):
        last = int(retrieve_index[b, 0])
        accept_index[b, 0] = last
        accepted = 0
        cur = int(retrieve_next_token[b, 0]) if num_spec > 1 else -1
        rank = 0
        while cur != -1:
            threshold = float(cum_prob[min(accepted, levels - 1), min(rank, ranks - 1)])
            if float(coins[b, accepted]) < threshold:
                predicts[last] = int(candidates[b, cur])
                accepted += 1
                last = int(retrieve_index[b, cur])
                accept_index[b, accepted] = last
                cur = int(retrieve_next_token[b, cur]) if accepted < num_spec - 1 else -1
                rank = 0
            else:
                cur = int(retrieve_next_sibling[b, cur])
                rank += 1
        accept_token_num[b] = accepted
        predicts[last] = bonus_token
    return None

