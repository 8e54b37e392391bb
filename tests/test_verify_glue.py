"""verify.py on the CPU: SGLang's greedy wrapper signature and ``eagle_sample`` (greedy and sampled batches) as
SGLang's verify calls them, with small stand-ins for SGLang's batch objects (tests/fake_sglang.py)."""

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.speculative import eagle_utils

from sgl_eagle_triton import verify
from sgl_eagle_triton.devtools.reference.verify_greedy import verify_tree_greedy as verify_tree_greedy_ref
from sgl_eagle_triton.glue.call_sites import swapped
from sgl_eagle_triton.kernels.target_probs import prepare_target_probs
from sgl_eagle_triton.kernels.tree_sampling import tree_speculative_sampling
from tests import fake_sglang

BS, N, STEPS, VOCAB = 2, 4, 2, 64
# One tree per request: the root (0) has children 1 and 2, node 1 has child 3.
NEXT_TOKEN = [1, 3, -1, -1]
NEXT_SIBLING = [-1, 2, -1, -1]


def case(seed: int, device):
    """``(verify_input, logits [BS * N, VOCAB] fp32)`` with distinct draft tokens per request, on ``device``."""
    gen = torch.Generator().manual_seed(seed)
    candidates = torch.stack([torch.randperm(VOCAB, generator=gen)[:N] for _ in range(BS)])
    verify_input = SimpleNamespace(
        draft_token_num=N,
        draft_token=candidates.flatten().to(device),
        retrieve_index=torch.arange(BS * N, device=device).view(BS, N),
        retrieve_next_token=torch.tensor([NEXT_TOKEN] * BS, device=device),
        retrieve_next_sibling=torch.tensor([NEXT_SIBLING] * BS, device=device),
        max_tree_depth=STEPS + 1,
        tree_topk=2,
    )
    return verify_input, (torch.randn(BS * N, VOCAB, generator=gen) * 3).to(device)


def batch(info, device):
    return SimpleNamespace(forward_mode=fake_sglang.ForwardMode(), sampling_info=info,
                           seq_lens=torch.tensor([7, 11], device=device), device=device)


def greedy_outputs(device):
    return (torch.zeros(BS * N, dtype=torch.int32, device=device),
            torch.full((BS, STEPS + 1), -1, dtype=torch.int32, device=device),
            torch.empty(BS, dtype=torch.int32, device=device))


def test_greedy_wrapper_takes_sglang_keywords_and_returns_its_outputs(device):
    verify_input, logits = case(0, device)
    target = logits.argmax(-1).view(BS, N)
    ours, expected = greedy_outputs(device), greedy_outputs(device)
    trees = (verify_input.draft_token.view(BS, N), verify_input.retrieve_index, verify_input.retrieve_next_token,
             verify_input.retrieve_next_sibling, target)
    out = verify.verify_tree_greedy_func(
        predicts=ours[0], accept_index=ours[1], accept_token_num=ours[2], candidates=trees[0],
        retrieve_index=trees[1], retrieve_next_token=trees[2], retrieve_next_sibling=trees[3],
        target_predict=trees[4], topk=2)
    verify_tree_greedy_ref(*expected, *trees)
    assert all(o is t for o, t in zip(out, ours, strict=True))
    assert all(torch.equal(o, e) for o, e in zip(ours, expected, strict=True))


@pytest.mark.usefixtures("published_server")  # SGLang's greedy eagle_sample reads the published settings (0.5.18+)
@pytest.mark.parametrize("follow", [False, True])
def test_eagle_sample_greedy_batch_runs_our_greedy_kernel(device, follow):
    verify_input, logits = case(1, device)
    if follow:  # the target agrees with draft nodes 1 and 3 of request 0: two tokens accepted there
        for node, child in ((0, 1), (1, 3)):
            logits[node, verify_input.draft_token[child]] = 100.0
    expected = greedy_outputs(device)
    verify_tree_greedy_ref(*expected, verify_input.draft_token.view(BS, N), verify_input.retrieve_index,
                           verify_input.retrieve_next_token, verify_input.retrieve_next_sibling,
                           logits.argmax(-1).view(BS, N))
    before = verify.RAN[verify.VERIFY_GREEDY]
    with swapped(eagle_utils, "verify_tree_greedy_func", verify.verify_tree_greedy_func):
        predict, accept_lens, accept_index = verify.eagle_sample(
            verify_input, batch(fake_sglang.sampling_info(BS, greedy=True, device=device), device),
            SimpleNamespace(next_token_logits=logits))
    assert verify.RAN[verify.VERIFY_GREEDY] == before + 1
    assert torch.equal(predict, expected[0]) and torch.equal(accept_index, expected[1])
    assert torch.equal(accept_lens, expected[2] + 1)
    if follow:
        assert accept_lens[0] == 3


@pytest.fixture
def fixed_coins(monkeypatch, device):
    """SGLang's coin source replaced by fixed coins (recording what it was asked for); thresholds 1."""
    gen = torch.Generator().manual_seed(7)
    coins = (torch.rand(BS, N, generator=gen).to(device), torch.rand(BS, generator=gen).to(device))
    asked = []

    def verify_coins(**kwargs):
        asked.append(kwargs)
        return coins

    monkeypatch.setattr(eagle_utils, "_verify_coins", verify_coins)
    monkeypatch.setattr(verify, "get_spec", lambda: SimpleNamespace(speculative_accept_threshold_single=1.0,
                                                                    speculative_accept_threshold_acc=1.0))
    return coins, asked


@pytest.mark.parametrize("bias", [False, True])
def test_eagle_sample_sampled_batch_runs_our_sampling_kernels(device, fixed_coins, bias):
    """SGLang's logit processing (here a logit bias) before our target probabilities, SGLang's coins, our tree
    sampling: the result equals those kernels composed by hand, accept lengths counting the bonus token."""
    coins, asked = fixed_coins
    verify_input, logits = case(2, device)
    logit_bias = None
    if bias:  # each request's bias makes its draft token of node 1 certain at the root
        logit_bias = torch.zeros(BS, VOCAB, device=device)
        logit_bias[torch.arange(BS), verify_input.draft_token.view(BS, N)[:, 1]] = 100.0
    info = fake_sglang.sampling_info(BS, greedy=False, temperature=0.7, top_k=5, top_p=0.9, min_p=0.01,
                                     logit_bias=logit_bias, device=device)
    processed = logits + (logit_bias.repeat_interleave(N, dim=0) if bias else 0)
    probs = prepare_target_probs(processed, info.temperatures, info.top_ks, info.top_ps, info.min_ps, N)
    expected = greedy_outputs(device)
    tree_speculative_sampling(*expected, verify_input.draft_token.view(BS, N), verify_input.retrieve_index,
                              verify_input.retrieve_next_token, verify_input.retrieve_next_sibling, *coins,
                              probs.view(BS, N, -1), 1.0, 1.0)
    before = verify.RAN[verify.VERIFY_SAMPLING]
    predict, accept_lens, accept_index = verify.eagle_sample(verify_input, batch(info, device),
                                                             SimpleNamespace(next_token_logits=logits))
    assert verify.RAN[verify.VERIFY_SAMPLING] == before + 1
    assert torch.equal(predict, expected[0]) and torch.equal(accept_index, expected[1])
    assert torch.equal(accept_lens, expected[2] + 1)
    if bias:
        assert (accept_lens >= 2).all()
    assert asked[0]["draft_token_num"] == N and asked[0]["seq_lens"].tolist() == [7, 11]
    assert asked[0]["sampling_info"] is info


def test_sampled_verification_is_rank_0s_on_every_tp_rank(device, fixed_coins, monkeypatch):
    """Under TP (SGLang's TP group initialised, 2 ranks) the sampled results are broadcast from rank 0, as SGLang's
    eagle_sample does: a rank that sampled otherwise ends with rank 0's predicts, accept index and lengths."""
    from sglang.srt.distributed import parallel_state

    verify_input, logits = case(3, device)
    info = fake_sglang.sampling_info(BS, greedy=False, temperature=0.7, top_k=5, top_p=0.9, min_p=0.01,
                                     device=device)
    own = verify.eagle_sample(verify_input, batch(info, device), SimpleNamespace(next_token_logits=logits))
    # rank 0's predicts, accept index and accepted drafts (broadcast in that order): nothing accepted, token 5
    rank_0 = (torch.full_like(own[0], 5), torch.zeros_like(own[2]), torch.zeros_like(own[1]))
    sent = []

    def broadcast(t, src):
        sent.append(src)
        t.copy_(rank_0[len(sent) - 1])

    monkeypatch.setattr(parallel_state, "_TP", SimpleNamespace(world_size=2, broadcast=broadcast))
    predict, accept_lens, accept_index = verify.eagle_sample(verify_input, batch(info, device),
                                                             SimpleNamespace(next_token_logits=logits))
    assert sent == [0, 0, 0]
    assert (predict == 5).all() and (accept_index == 0).all() and (accept_lens == 1).all()


@pytest.mark.usefixtures("published_server")
@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
@pytest.mark.parametrize("mode, length", [("fixed", 2), ("fixed", 3), ("real-draft-token", 2)])
def test_simulated_acceptance_as_sglang_applies_it(device, fixed_coins, monkeypatch, greedy, mode, length):
    """``SGLANG_SIMULATE_ACC_LEN`` (benchmarks): both paths end with SGLang's simulated acceptance of ``length``
    tokens ("match-expected" with an integer length: exactly that many), in its token mode."""
    from sglang.srt.speculative import spec_utils

    monkeypatch.setattr(spec_utils, "SIMULATE_ACC_LEN", float(length))
    monkeypatch.setattr(spec_utils, "SIMULATE_ACC_TOKEN_MODE", mode)
    monkeypatch.setattr(spec_utils, "SIMULATE_ACC_METHOD", "match-expected")
    monkeypatch.setattr(spec_utils.generate_simulated_accept_index, "__defaults__",
                        (float(length), "match-expected", mode))
    verify_input, logits = case(3, device)
    verify_input.tree_topk = 1  # real draft tokens need a chain; the walk itself does not care
    info = fake_sglang.sampling_info(BS, greedy=greedy, temperature=0.7, device=device)
    with swapped(eagle_utils, "verify_tree_greedy_func", verify.verify_tree_greedy_func):
        predict, accept_lens, accept_index = verify.eagle_sample(verify_input, batch(info, device),
                                                                 SimpleNamespace(next_token_logits=logits))
    assert (accept_lens == length).all()
    first = torch.arange(BS, device=device).view(BS, 1) * N
    assert torch.equal(accept_index[:, :length], (first + torch.arange(length, device=device)).int())
    assert (accept_index[:, length:] == -1).all()
    if mode == "fixed":
        assert (predict == 100).all()
    else:  # draft tokens of nodes 1 .. length - 1, then the target's argmax at the last accepted node
        cand = verify_input.draft_token.view(BS, N)
        bonus = logits.argmax(-1).view(BS, N)[:, length - 1]
        rows = predict.view(BS, N)
        assert torch.equal(rows[:, : length - 1].long(), cand[:, 1:length]) and torch.equal(rows[:, length - 1].long(),
                                                                                            bonus)
