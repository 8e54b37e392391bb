"""Random draft trees and verify outputs shared by the tree-verification kernel tests (greedy and sampled)."""

import torch

OUTPUT_NAMES = ("predicts", "accept_index", "accept_token_num")


def make_tree(rng, n, max_depth, topk):
    """A random draft tree of ``n`` nodes linked as SGLang's build_tree links them.

    Node ``r`` gets a random parent among nodes ``< r`` of depth ``< max_depth`` with fewer than ``topk``
    children (any node of depth ``< max_depth`` once none is left). A node's first child is its smallest,
    each child's next sibling the next larger one. Returns (next_token, next_sibling, children) lists.
    """
    depth, children = [0], [[]]
    for r in range(1, n):
        open_nodes = [p for p in range(r) if depth[p] < max_depth]
        parent = rng.choice([p for p in open_nodes if len(children[p]) < topk] or open_nodes)
        children[parent].append(r)
        depth.append(depth[parent] + 1)
        children.append([])
    next_token = [kids[0] if kids else -1 for kids in children]
    next_sibling = [-1] * n
    for kids in children:
        for a, c in zip(kids, kids[1:], strict=False):
            next_sibling[a] = c
    return next_token, next_sibling, children


def poisoned_outputs(rng, bs, n, num_spec):
    """int32 outputs (predicts [bs * n], accept_index [bs, num_spec], accept_token_num [bs]) pre-filled with
    random junk, so that untouched elements are detectable."""
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    return tuple(
        torch.randint(-(1 << 31), 1 << 31, shape, generator=gen).to(torch.int32)
        for shape in ((bs * n,), (bs, num_spec), (bs,))
    )


def assert_same_outputs(got, expected):
    for name, g, e in zip(OUTPUT_NAMES, got, expected, strict=True):
        assert torch.equal(g.cpu(), e.cpu()), name


def check_against_reference(kernel, reference, outputs, inputs, device, extra=()):
    """The twin on copies of ``outputs`` (CPU), the kernel on ``device``; all three outputs must match
    exactly. ``extra``: trailing scalar arguments of both. Returns the twin's outputs."""
    expected = [t.clone() for t in outputs]
    reference(*expected, *inputs, *extra)
    got = [t.to(device) for t in outputs]
    kernel(*got, *(t.to(device) for t in inputs), *extra)
    assert_same_outputs(got, expected)
    return expected


def sgl_kernel_tree_args(outputs, candidates, retrieve_index, next_token, next_sibling) -> dict:
    """The keyword arguments sgl-kernel's tree-verification ops share (its spelling: ``retrive_*``)."""
    return dict(predicts=outputs[0], accept_index=outputs[1], accept_token_num=outputs[2], candidates=candidates,
                retrive_index=retrieve_index, retrive_next_token=next_token, retrive_next_sibling=next_sibling)


def check_graph_replay(kernel, reference, inputs, outputs, fresh):
    """Captured once on CUDA ``inputs`` / ``outputs``, the launch handles fresh cases copied into the captured
    buffers; ``fresh()`` returns a new (inputs, outputs) pair on the CPU."""
    kernel(*outputs, *inputs)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel(*outputs, *inputs)
    for _ in range(3):
        fresh_inputs, fresh_outputs = fresh()
        for dst, src in zip(inputs + outputs, fresh_inputs + fresh_outputs, strict=True):
            dst.copy_(src)
        expected = [t.clone() for t in fresh_outputs]
        reference(*expected, *fresh_inputs)
        graph.replay()
        assert_same_outputs(outputs, expected)
