"""The overlap scheduler's relay after a fill-only step (glue.relay), on this SGLang's own ``FutureMap`` (CPU
tensors): a marked payload scatters the bonus token alone and leaves the relayed top-k and hidden states as they
were; the next step's resolve gathers the bonus token and keeps (or resizes) the stubs; everything unmarked goes to
SGLang's methods. Runs on every served release (tools/sglang_lanes.sh)."""

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.speculative import spec_utils
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from sgl_eagle_triton.glue import relay

POOL, TOPK, HIDDEN = 8, 1, 4


def _pool():
    """SGLang's request-to-token pool as the future map reads it."""
    return SimpleNamespace(req_to_token=torch.zeros(POOL, 16, dtype=torch.int32))


@pytest.fixture
def future_map(monkeypatch):
    """The relaying future map, nothing stashed yet."""
    monkeypatch.setattr(spec_utils, "spec_need_hidden_states", lambda *a, **k: True)  # an EAGLE-3 server's answer
    made = SpeculativeAlgorithm.EAGLE3.create_future_map(torch.device("cpu"), _pool())
    base = type(made)
    fm = relay.bonus_only_after_fill(made)
    assert isinstance(fm, base) and type(fm) is not base
    assert type(relay.bonus_only_after_fill(fm)) is type(fm)  # idempotent: one subclass per SGLang class
    return fm


def _payload(bonus, stub: bool, seed: int = 0):
    from sglang.srt.managers.overlap_utils import RelayPayload

    gen, rows = torch.Generator().manual_seed(seed), len(bonus)
    if stub:
        extras = (torch.zeros(rows, TOPK), torch.zeros(rows, TOPK, dtype=torch.int64), torch.zeros(rows, HIDDEN))
        extras = tuple(relay.mark_stub(t) for t in extras)
    else:
        extras = (torch.rand(rows, TOPK, generator=gen) + 0.5, torch.randint(1, 99, (rows, TOPK), generator=gen),
                  torch.randn(rows, HIDDEN, generator=gen))
    return RelayPayload(bonus_tokens=torch.tensor(bonus, dtype=torch.int32), topk_p=extras[0], topk_index=extras[1],
                        hidden_states=extras[2])


def _draft_input(indices, payload):
    return SimpleNamespace(future_indices=torch.tensor(indices), topk_p=payload.topk_p, topk_index=payload.topk_index,
                           hidden_states=payload.hidden_states, bonus_tokens=None, draft_probs=None,
                           future_dsa_topk_indices_available=False, dsa_topk_indices="stale")


def test_a_fill_only_step_relays_its_bonus_token_alone(future_map):
    rows = torch.tensor([2, 5])
    real = _payload([11, 12], stub=False, seed=1)
    future_map.stash(rows, real)  # a drafting step (SGLang's stash makes the buffers)
    assert future_map.topk_p_buf is not None and future_map.hidden_states_buf is not None
    stub = _payload([21, 22], stub=True)
    future_map.stash(rows, stub)
    assert future_map.output_tokens_buf[rows].tolist() == [21, 22]
    assert torch.equal(future_map.topk_p_buf[rows], real.topk_p)  # untouched: nothing reads them
    assert torch.equal(future_map.topk_index_buf[rows], real.topk_index)
    assert torch.equal(future_map.hidden_states_buf[rows], real.hidden_states.to(future_map.hidden_states_buf.dtype))

    batch = SimpleNamespace(spec_info=_draft_input([2, 5], stub))
    future_map._resolve_spec_extras(batch)
    draft = batch.spec_info
    assert draft.bonus_tokens.tolist() == [21, 22] and draft.dsa_topk_indices is None
    assert draft.topk_p is stub.topk_p and draft.hidden_states is stub.hidden_states  # the stubs, no gather

    batch = SimpleNamespace(spec_info=_draft_input([2, 5, 7], stub))  # a request joined: only future_indices grew
    future_map._resolve_spec_extras(batch)
    draft = batch.spec_info
    assert draft.topk_p.shape == (3, TOPK) and draft.hidden_states.shape == (3, HIDDEN) and relay.is_stub(draft.topk_p)
    assert not draft.topk_p.any() and draft.topk_index.dtype == torch.int64


def test_a_payload_of_the_token_alone_relays_the_token_alone(future_map):
    """A held step's result carries no draft input: the scheduler relays its token as a no-spec step's (SGLang's own
    stash would fail on the missing top-k on this server); the relayed top-k and hidden states stay as they were."""
    from sglang.srt.managers.overlap_utils import RelayPayload

    rows = torch.tensor([2, 5])
    real = _payload([11, 12], stub=False, seed=4)
    future_map.stash(rows, real)
    future_map.stash(rows, RelayPayload(bonus_tokens=torch.tensor([31, 32])))
    assert future_map.output_tokens_buf[rows].tolist() == [31, 32]
    assert torch.equal(future_map.topk_p_buf[rows], real.topk_p)


def test_an_announced_publish_is_left_out(future_map):
    """The publish after a held step (``publish_unfenced``) writes nothing and records no spec-v2 event (nothing
    reads a held step's lengths); the next one is SGLang's spec-v2 publish again, with its write and event."""
    rows = torch.tensor([1, 6])
    before = future_map.new_seq_lens_buf[rows].clone()
    relay.publish_unfenced(future_map)
    future_map.publish(rows, torch.tensor([40, 50]))
    assert torch.equal(future_map.new_seq_lens_buf[rows], before) and future_map.publish_ready is None
    future_map.publish(rows, torch.tensor([41, 51]))
    assert future_map.new_seq_lens_buf[rows].tolist() == [41, 51] and future_map.publish_ready is not None
    relay.publish_unfenced(None)  # (a process without the relaying future map: nothing)


def test_unmarked_relays_and_resolves_are_sglangs(future_map, monkeypatch):
    rows = torch.tensor([1, 3])
    first, second = _payload([1, 2], stub=False, seed=2), _payload([3, 4], stub=False, seed=3)
    future_map.stash(rows, first)
    future_map.stash(rows, second)  # a drafting step after another: every buffer rewritten
    assert future_map.output_tokens_buf[rows].tolist() == [3, 4]
    assert torch.equal(future_map.topk_p_buf[rows], second.topk_p)
    assert torch.equal(future_map.hidden_states_buf[rows], second.hidden_states)

    base = type(future_map).__mro__[1]
    resolved = []
    monkeypatch.setattr(base, "_resolve_spec_extras", lambda self, batch: resolved.append(batch))
    unmarked = SimpleNamespace(spec_info=_draft_input([1, 3], second))
    dsa = SimpleNamespace(spec_info=_draft_input([1, 3], _payload([3, 4], stub=True)))
    dsa.spec_info.future_dsa_topk_indices_available = True
    empty = SimpleNamespace(spec_info=_draft_input([], _payload([], stub=True)))
    for batch in (unmarked, dsa, empty, SimpleNamespace(spec_info=None)):
        future_map._resolve_spec_extras(batch)
    assert resolved[:3] == [unmarked, dsa, empty] and len(resolved) == 4


def test_the_first_stash_is_sglangs_even_marked(future_map):
    """SGLang makes its relay buffers from the first payload it stashes: a marked one goes to SGLang's stash too."""
    fm, rows = future_map, torch.tensor([4])
    assert getattr(fm, "topk_p_buf", None) is None  # no buffers before the first stash
    fm.stash(rows, _payload([9], stub=True))
    assert fm.output_tokens_buf[rows].tolist() == [9] and fm.topk_p_buf is not None
    assert torch.equal(fm.topk_p_buf[rows], torch.zeros(1, TOPK))


def test_our_algorithm_makes_the_relaying_future_map(monkeypatch):
    from sgl_eagle_triton.plugin import EagleTritonSpecAlgo

    fm = EagleTritonSpecAlgo.create_future_map(SpeculativeAlgorithm.EAGLE3, torch.device("cpu"), _pool())
    assert type(fm) is relay._bonus_only_class(type(fm).__mro__[1])
