"""sgl_eagle_triton.row_graphs.RowGraphs (steps 0's KV fill as CUDA graphs): replays on padded copies of a batch's
rows, the rows beyond a batch written with their pads (a KV slot a larger batch left must not be written again),
eager beyond the largest size; on the CPU with a stand-in graph that replays the captured call on the static inputs
as they are at replay, on CUDA with real graphs."""

import contextlib

import pytest
import torch

from sgl_eagle_triton.row_graphs import RowGraphs


class RecordedGraph:
    """A stand-in for ``torch.cuda.CUDAGraph``: the call made while capturing runs again at each replay, reading
    its (static) inputs as they are then."""

    def __init__(self):
        self.call = None

    def replay(self):
        self.call()


def recording(calls):
    @contextlib.contextmanager
    def capturing(graph):
        calls.clear()
        yield
        graph.call = calls[-1]

    return capturing


def make_fill(device):
    """A fill like steps 0's: ``pool[loc] = ids * 1000 + positions + hidden.sum(-1)`` (what lands where)."""
    pool = torch.full((64,), -1.0, device=device)
    calls = []

    def fill(ids, hidden, positions, loc):
        def run():
            pool[loc] = ids.to(torch.float32) * 1000 + positions.to(torch.float32) + hidden.sum(-1)
        calls.append(run)
        run()

    return pool, fill, calls


def graphs_for(device, pads=(0, None, 0, 0)):
    pool, fill, calls = make_fill(device)
    if device == "cuda":
        graphs = RowGraphs(fill, [1, 2, 4], pads)
    else:
        graphs = RowGraphs(fill, [1, 2, 4], pads, graph=RecordedGraph, capturing=recording(calls))
    example = (torch.zeros(1, dtype=torch.int64, device=device), torch.zeros(1, 3, device=device),
               torch.zeros(1, dtype=torch.int64, device=device), torch.zeros(1, dtype=torch.int64, device=device))
    graphs.capture(example)
    return pool, fill, graphs


def rows(n, first_slot, device, seed):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(1, 50, (n,), generator=gen, dtype=torch.int32).to(device),  # int32, as SGLang's tokens
            torch.randn(n, 3, generator=gen).to(device),
            torch.randint(1, 900, (n,), generator=gen).to(device),
            torch.arange(first_slot, first_slot + n, device=device))


def expected(pool_before, inputs):
    ids, hidden, positions, loc = inputs
    want = pool_before.clone()
    want[loc] = ids.to(torch.float32) * 1000 + positions.to(torch.float32) + hidden.sum(-1)
    return want


def test_batches_replay_their_graph_padded_into_slot_0_and_eager_above_the_largest(device):
    pool, _, graphs = graphs_for(device)
    assert sorted(graphs.graphs) == [1, 2, 4] and graphs.graph_for(3) is graphs.graphs[4][0]
    assert graphs.graph_for(5) is None
    pool.fill_(-1.0)
    four = rows(4, 10, device, seed=1)
    want = expected(pool, four)
    graphs(*four)
    assert torch.equal(pool, want) and graphs.replays == 1
    # three rows in the 4-row graph: the fourth row's slot (13, left by the batch before) is not written again,
    # the padding slot 0 is
    three = rows(3, 20, device, seed=2)
    want = expected(pool, three)
    graphs(*three)
    assert torch.equal(pool[1:], want[1:]) and pool[13] == want[13] and graphs.replays == 2
    assert pool[0] == 0.0 + graphs.graphs[4][1][1][3].sum()  # token 0 at position 0, the stale hidden row
    five = rows(5, 30, device, seed=3)
    want = expected(pool, five)
    graphs(*five)
    assert torch.equal(pool, want) and graphs.eager == 1 and graphs.replays == 2
    one = rows(1, 40, device, seed=4)
    want = expected(pool, one)
    graphs(*one)
    assert torch.equal(pool, want) and graphs.replays == 3


def test_one_set_of_static_inputs_and_inputs_of_another_shape_run_eagerly(device):
    """Every size's graph reads views of one set of static inputs (the largest size's); a batch whose inputs are
    not shaped as the captured ones (here 5 hidden features instead of 3) runs eagerly instead of failing."""
    pool, _, graphs = graphs_for(device)
    assert len({graphs.graphs[n][1][1].data_ptr() for n in (1, 2, 4)}) == 1
    ids, _, positions, loc = rows(2, 50, device, seed=5)
    wide = (ids, torch.randn(2, 5, device=device), positions, loc)
    want = expected(pool, wide)
    graphs(*wide)
    assert torch.equal(pool, want) and graphs.eager == 1 and graphs.mismatched == 1 and graphs.replays == 0


def test_without_a_pad_for_the_slots_a_stale_row_writes_a_freed_slot_again(device):
    """The broken variant the test above catches: slots not padded, a smaller batch's graph writes the last batch's
    fourth row into its old slot again (which may belong to another request by then)."""
    pool, _, graphs = graphs_for(device, pads=(0, None, 0, None))
    graphs(*rows(4, 10, device, seed=1))
    pool[13] = -5.0  # slot 13 freed and written by another request
    graphs(*rows(3, 20, device, seed=2))
    assert pool[13] != -5.0


def test_pads_are_written_again_only_after_a_larger_batch_and_survive_smaller_graphs(device, monkeypatch):
    """The pads beyond a batch are written where a larger batch wrote rows since (4 rows, 1 row in the 1-row graph,
    then 3 rows in the 4-row graph: its fourth row writes the padding slot 0, not the 4-row batch's slot 13, freed
    and reused by then), and not at all while the batch size holds (the steady state: no fills)."""
    pool, _, graphs = graphs_for(device)
    fills = []
    real_fill = torch.Tensor.fill_
    monkeypatch.setattr(torch.Tensor, "fill_", lambda x, v: fills.append(v) or real_fill(x, v))
    graphs(*rows(4, 10, device, seed=4))
    graphs(*rows(1, 30, device, seed=1))
    pool[13] = -5.0  # slot 13 freed and written by another request
    graphs(*rows(3, 20, device, seed=3))
    assert pool[13] == -5.0 and len(fills) == 3  # ids, positions and slots padded once, after the 4-row batch
    fills.clear()
    for seed in range(3):
        inputs = rows(3, 40 + 4 * seed, device, seed=10 + seed)
        want = expected(pool, inputs)
        graphs(*inputs)
        assert torch.equal(pool[1:], want[1:])
    assert fills == [] and graphs.replays == 6


def test_pads_forgotten_after_a_smaller_graph_write_a_freed_slot_again(device):
    """The broken variant the test above catches: a watermark that forgets, after a batch in a smaller graph, the
    rows a larger batch left, so that the 4-row graph's fourth row writes the old slot 13 again."""
    pool, _, graphs = graphs_for(device)
    graphs(*rows(4, 10, device, seed=4))
    graphs(*rows(1, 30, device, seed=1))
    graphs._dirty = 1  # forgets the 4-row batch's rows
    pool[13] = -5.0  # slot 13 freed and written by another request
    graphs(*rows(3, 20, device, seed=3))
    assert pool[13] != -5.0


@pytest.mark.gpu
def test_real_cuda_graphs_fill_as_the_eager_call():
    """Real capture on CUDA (the suite's device runs above also capture): every batch size from 1 to 5 in turn,
    the graphed fill's pool equal to the eager fill's everywhere but the padding slot 0."""
    pool, fill, graphs = graphs_for("cuda")
    eager_pool, eager_fill, _ = make_fill("cuda")
    pool.fill_(-1.0)
    for n in (1, 2, 3, 4, 5, 3, 1):
        inputs = rows(n, 8 * n, "cuda", seed=n)
        graphs(*inputs)
        eager_fill(*inputs)
        torch.cuda.synchronize()
        assert torch.equal(pool[1:], eager_pool[1:]), n


def test_a_function_that_returns_its_results_gets_the_captured_outputs_sliced_to_the_batch(device):
    """``fn`` returning a tuple (the lean draft's tree): a replay returns the captured call's outputs, sliced to the
    batch's rows and written by that replay (on the CPU the stand-in writes them again); eager above the largest
    size returns fn's own; a fill returns None."""
    calls = []

    def tree(a, b):
        out = (a * 10 + b, (a - b).sum(-1, keepdim=True))

        def run():  # what a replay recomputes into the captured outputs
            out[0].copy_(a * 10 + b)
            out[1].copy_((a - b).sum(-1, keepdim=True))
        calls.append(run)
        return out

    if device == "cuda":
        graphs = RowGraphs(tree, [1, 2, 4], (0, 0))
    else:
        graphs = RowGraphs(tree, [1, 2, 4], (0, 0), graph=RecordedGraph, capturing=recording(calls))
    graphs.capture((torch.zeros(1, 3, dtype=torch.int64, device=device), torch.zeros(1, 3, dtype=torch.int64,
                                                                                     device=device)))
    gen = torch.Generator().manual_seed(3)
    for n in (3, 1, 4, 6):
        a, b = (torch.randint(0, 9, (n, 3), generator=gen).to(device) for _ in range(2))
        got = graphs(a, b)
        assert [x.shape[0] for x in got] == [n, n]
        assert torch.equal(got[0], a * 10 + b) and torch.equal(got[1], (a - b).sum(-1, keepdim=True))
    assert graphs.replays == 3 and graphs.eager == 1
    pool, _, fills = graphs_for(device)
    ids = torch.ones(2, dtype=torch.int64, device=device)
    assert fills(ids, torch.zeros(2, 3, device=device), ids, ids) is None
