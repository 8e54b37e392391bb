"""Target distribution for sampled verification: temperature, softmax, then joint top-k / top-p / min-p.

Per row of target logits this yields exactly the distribution SGLang's *non-speculative* samplers draw
from (``top_k_top_p_min_p_sampling_from_probs_torch`` in ``sglang/srt/layers/sampler.py``, and
flashinfer's ``filter_apply_order="joint"``): the three filters are all evaluated on the same softmax
``p``, and token ``i`` is kept iff

* top-k: ``count(p_j > p_i) < top_k``                (all ties at the k-th value kept),
* top-p: ``sum(p_j for p_j > p_i) <= top_p``         (the minimal descending prefix reaching top_p, ties kept),
* min-p: ``p_i >= min_p * max(p)``.

Stock SGLang's EAGLE verify (``eagle_utils.verify_tree_*`` sampling branch) differs on purpose: it applies
``top_k_renorm_prob``, then ``top_p_renorm_prob`` on the *renormalised* top-k probabilities, and ignores
min-p, so a speculative request samples from another distribution than the same request decoded without
speculation. Ours matches the non-speculative sampler. (flashinfer 0.6.15, behind sgl-kernel, keeps ``i``
for top-p iff the strictly larger mass is ``< top_p`` (``< top_p * sum(p)`` in its radix renorm kernel for
V >= 2048), in ``top_p_renorm_prob`` and in joint sampling alike; SGLang's torch sampler and ours use
``<=``. They differ only when a prefix sum equals ``top_p`` exactly. At top-k, flashinfer keeps every tie
of the k-th value as we do; SGLang's torch sampler keeps exactly k, in sort order.)

Every kept set has the form ``{i : e_i >= tau}`` with ``e = exp(l - max(l))``, ``l = logits / T``; ties and
thresholds are decided on these float32 ``e`` (their int32 bit patterns, ``key``, are monotone since
``e >= 0``; ``max(e) = 1``, so min-p is simply ``e_i >= min_p``). ``tau`` is found without sorting the
vocabulary. Each row is split into ``SPLIT`` slices of whole ``BLOCK_V`` chunks (``tree_rows.row_slices``:
on an H100 32 slices of 4096 tokens at V = 128256 up to 8 rows, fewer as rows grow, one from 264 rows up), one
program each on grid ``(rows, SPLIT)``, and every pass is one launch that reads the slice's logits (never
a scratch copy):

1. ``_stats_kernel``: per slice, the max of ``l``, the sum of ``exp(l - max)`` and the first argmax;
2. ``_search_kernel``, ``MAX_PASSES`` launches: each tests ``G - 1`` probe keys at once inside the key
   bracket ``[lo, hi]`` that holds ``tau``: per probe, count and mass of the slice's tokens of the bracket
   above it, by ``[BLOCK_S, G]`` compares that chunks without a token of the bracket skip. The first probe
   at which the filters hold bounds the new bracket, at most ~G times narrower; the search stops once at
   most one token lies in it (that token is then kept), typically after 2 to 4 passes at V = 128K. Bound:
   from the 2**28 keys between 2**-32 (where the search starts) and 1, five passes leave fewer than G keys
   and a sixth probes each; when ``tau`` lies below 2**-32, the first pass finds that and six more descend
   the ~2**29.6 keys below: ``MAX_PASSES = 7``. Rows done earlier exit at once;
3. ``_write_kernel``: ``e / S`` where ``key >= tau``, else 0; ``S``, the kept mass, comes out of the search.

No combine kernel runs between passes: every program of a row sums the previous pass's ``[SPLIT, G]``
partials itself (all in the same order, so they agree bit for bit) and advances the row's state; program 0
stores it for the next launch. A row in one program (``SPLIT == 1``) needs no partials: it runs its whole
search in the first search launch, and the other ``MAX_PASSES - 1`` are not launched (``MAX_PASSES + 2``
launches when rows are split, else 3; fixed for a given shape). Scratch, int32 (floats stored in place):
``[R, 3, SPLIT]`` slice statistics, then two slots of ``[R, 8]`` search state and two of
``[R, SPLIT, 2, G]`` partials; pass ``p`` writes slots ``p % 2`` and reads slots ``(p - 1) % 2``.

Rows need no search when top-k and top-p are both off (``top_k >= V``, ``top_p >= 1``: one pass sums
``e >= min_p``, none when ``min_p == 0``). ``top_k == 1`` (SGLang's greedy requests inside sampled
batches) is one-hot at the first index of the largest ``logits / T``, exactly ``torch.argmax``: the
token greedy decoding picks, even at exact ties.
All sums are float32; the decisions and the output use the same sums, so the result is self-consistent.
"""

import torch
import triton
import triton.language as tl

from sgl_eagle_triton.kernels.device import device_info, warps
from sgl_eagle_triton.kernels.tree_rows import MAX_SPLIT, row_slices

KEY_ONE = tl.constexpr(0x3F800000)  # int32 bits of 1.0f: the key of the row maximum, whose e = exp(0) = 1
FLOOR_KEY = tl.constexpr(0x2F800000)  # bits of 2**-32: searches start here and look lower only if needed
BLOCK_V = 2048  # tokens per loop step
BLOCK_S = 512  # tokens per [BLOCK_S, G] probe compare
G = 32  # probes per search pass
MAX_PASSES = 7  # search passes that always suffice (module docstring)


@triton.jit
def _exp_keys(logits_ptr, base, offs, end, temperature, row_max):
    """``e = exp(l - max)`` of a chunk (0 from ``end`` on) and its monotone int32 keys; ``l = logits / T``
    correctly rounded, as torch's and as in ``_stats_kernel``."""
    x = tl.load(logits_ptr + base + offs, mask=offs < end, other=float("-inf"))
    e = tl.exp(tl.math.div_rn(x, temperature) - row_max)
    return e, e.to(tl.int32, bitcast=True)


@triton.jit
def _slice(slice_len, V: tl.constexpr):
    """``[start, end)``: the tokens of this program's slice of its row (walked by ``while`` loops: the
    interpreter cannot take tensors as ``range`` bounds)."""
    start = tl.program_id(1) * slice_len
    return start, tl.minimum(start + slice_len, V)


@triton.jit
def _request(temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, request, V: tl.constexpr):
    """A request's ``(temperature, top_k, top_p, min_key, greedy, settled)``; ``settled``: no search needed."""
    temperature = tl.load(temperature_ptr + request).to(tl.float32)
    top_k = tl.minimum(tl.maximum(tl.load(top_k_ptr + request).to(tl.int64), 1), V).to(tl.int32)
    top_p = tl.load(top_p_ptr + request).to(tl.float32)
    min_p = tl.load(min_p_ptr + request).to(tl.float32)
    min_key = tl.where(min_p > 0.0, tl.minimum(min_p.to(tl.int32, bitcast=True), KEY_ONE), 0)
    greedy = top_k == 1
    return temperature, top_k, top_p, min_key, greedy, greedy | ((top_k >= V) & (top_p >= 1.0))


@triton.jit
def _row_stats(scratch_ptr, fscratch_ptr, stats, split, V: tl.constexpr, MAX_SPLIT: tl.constexpr):
    """``(max(l), sum(exp(l - max)), first argmax)`` of the row, from its slices' statistics."""
    ids = tl.arange(0, MAX_SPLIT)
    valid = ids < split
    maxes = tl.load(fscratch_ptr + stats + ids, mask=valid, other=float("-inf"))
    sums = tl.load(fscratch_ptr + stats + split + ids, mask=valid, other=0.0)
    firsts = tl.load(scratch_ptr + stats + 2 * split + ids, mask=valid, other=V)
    row_max = tl.max(maxes, axis=0)
    z = tl.sum(sums * tl.exp(maxes - row_max), axis=0)
    return row_max, z, tl.min(tl.where(maxes == row_max, firsts, V), axis=0)


@triton.jit
def _probes(lo, hi, G: tl.constexpr):
    """[G] int32 probe keys of bracket ``[lo, hi]``: probe 0 is ``lo - 1`` (it counts the whole bracket);
    probes 1..G-1 split ``[lo, hi - 1]`` evenly, or step through it key by key when it is narrower than G."""
    probe_ids = tl.arange(0, G)
    span = (hi - lo).to(tl.int64)
    spread = lo.to(tl.int64) + (span * probe_ids) // G
    dense = tl.minimum(lo.to(tl.int64) + probe_ids - 1, hi.to(tl.int64) - 1)
    return tl.where(probe_ids == 0, lo.to(tl.int64) - 1, tl.where(span >= G, spread, dense)).to(tl.int32)


@triton.jit
def _advance(lo, hi, probes, c_hi, m_hi, cnt, mass, q, settled, min_key, top_k, top_p, z, G: tl.constexpr):
    """``(lo, hi, c_hi, done, m_hi, kept_mass)`` after search pass ``q``, which found ``cnt`` tokens of the
    bracket ``[lo, hi]`` above each of its ``probes``, of mass ``mass`` ([G] each).

    ``tau`` lies in ``[lo, hi]``: tokens with key < lo are dropped, tokens with key > hi are kept (``c_hi``,
    ``m_hi``: their count and mass); once done, ``tau = lo`` and ``kept_mass`` is the mass of ``key >= tau``.
    """
    probe_ids = tl.arange(0, G)
    # f(t): "count above t < top_k and mass above t <= top_p * z" (min-p holds: t >= lo >= min_key).
    mass_limit = tl.where(top_p >= 1.0, float("inf"), top_p * z)
    # Probe 0 is a candidate only in the first pass and above min_key, i.e. when it tests the floor.
    lowest = tl.where((q == 0) & (lo > min_key), 0, 1)
    ok = (c_hi + cnt < top_k) & (m_hi + mass <= mass_limit) & (probe_ids >= lowest)
    first = tl.min(tl.where(ok, probe_ids, G), axis=0)  # G: none but hi itself
    # f fails at probe first - 1 and holds at probe first (or at hi): tau lies in between. first == 0:
    # f holds at the floor already, tau lies in [min_key, floor - 1].
    at_prev = probe_ids == tl.maximum(first - 1, 0)
    at_first = probe_ids == first  # nowhere when first == G
    prev_count = c_hi + tl.sum(tl.where(at_prev, cnt, 0), axis=0)
    kept_mass = m_hi + tl.sum(tl.where(at_prev, mass, 0.0), axis=0)
    new_c_hi = c_hi + tl.sum(tl.where(at_first, cnt, 0), axis=0)
    new_m_hi = m_hi + tl.sum(tl.where(at_first, mass, 0.0), axis=0)
    new_lo = tl.where(first == 0, min_key, tl.sum(tl.where(at_prev, probes, 0), axis=0) + 1)
    new_hi = tl.where(first < G, tl.sum(tl.where(at_first, probes, 0), axis=0), hi)
    # At most one token in [lo, hi]: f holds at its key as at hi (same tokens above it), so it is kept,
    # and tau = lo with kept mass = mass above prev.
    done = (first > 0) & ((prev_count - new_c_hi <= 1) | (new_lo >= new_hi))
    # A settling pass (min-p only, or a one-key bracket) measured the bracket's mass only: tau = lo.
    settle = settled | (lo >= hi)
    return (tl.where(settle, lo, new_lo), tl.where(settle, hi, new_hi), tl.where(settle, c_hi, new_c_hi),
            (settle | done).to(tl.int32), tl.where(settle, m_hi, new_m_hi),
            tl.where(settle, m_hi + tl.sum(tl.where(probe_ids == 0, mass, 0.0), axis=0), kept_mass))


@triton.jit
def _row_state(scratch_ptr, fscratch_ptr, row, p, split, state_in, part_in, top_k, top_p, min_key, greedy, settled,
               V: tl.constexpr, G: tl.constexpr, MAX_SPLIT: tl.constexpr):
    """The row's state before search pass ``p``: ``(lo, hi, c_hi, done, m_hi, kept_mass)`` (see ``_advance``),
    ``max(l)`` and ``z = sum(exp(l - max))``. Pass 0 derives it from the slices' statistics; pass ``p > 0``
    advances the state stored before pass ``p - 1`` (slot ``state_in``) by that pass's partials (slot
    ``part_in``), which it sums over the slices."""
    if p == 0:
        row_max, z, _ = _row_stats(scratch_ptr, fscratch_ptr, row * 3 * split, split, V, MAX_SPLIT)
        # A search starts at FLOOR_KEY (or min_key if higher); probe 0 of its first pass tests the floor.
        # No search: tau = lo = min_key and one pass sums its mass; keep all (its mass: z) when min_key is 0.
        lo = tl.where(greedy, KEY_ONE, tl.where(settled, min_key, tl.maximum(min_key, FLOOR_KEY)))
        hi = tl.full((), KEY_ONE, tl.int32)
        c_hi = tl.full((), 0, tl.int32)
        done = (greedy | (settled & (lo == 0))).to(tl.int32)
        m_hi = tl.full((), 0.0, tl.float32)
        kept_mass = z
    else:
        before = state_in + row * 8
        lo = tl.load(scratch_ptr + before)
        hi = tl.load(scratch_ptr + before + 1)
        c_hi = tl.load(scratch_ptr + before + 2)
        done = tl.load(scratch_ptr + before + 3)
        m_hi = tl.load(fscratch_ptr + before + 4)
        kept_mass = tl.load(fscratch_ptr + before + 5)
        row_max = tl.load(fscratch_ptr + before + 6)
        z = tl.load(fscratch_ptr + before + 7)
        if done == 0:
            ids = tl.arange(0, MAX_SPLIT)[:, None]
            cells = part_in + (row * split + ids) * 2 * G + tl.arange(0, G)[None, :]
            cnt = tl.sum(tl.load(scratch_ptr + cells, mask=ids < split, other=0), axis=0)
            mass = tl.sum(tl.load(fscratch_ptr + cells + G, mask=ids < split, other=0.0), axis=0)
            lo, hi, c_hi, done, m_hi, kept_mass = _advance(lo, hi, _probes(lo, hi, G), c_hi, m_hi, cnt, mass, p - 1,
                                                           settled, min_key, top_k, top_p, z, G)
    return lo, hi, c_hi, done, m_hi, kept_mass, row_max, z


@triton.jit
def _count_above(logits_ptr, base, slice_len, V: tl.constexpr, temperature, row_max, lo, hi, probes,
                 G: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_S: tl.constexpr):
    """[G] counts and masses of the slice's tokens of bracket ``[lo, hi]`` above each of its ``probes``. Chunks,
    and BLOCK_S parts of them, without a token of the bracket skip the ``[BLOCK_S, G]`` compares."""
    cnt = tl.zeros([G], tl.int32)
    mass = tl.zeros([G], tl.float32)
    start, end = _slice(slice_len, V)
    while start < end:
        offs = start + tl.arange(0, BLOCK_V)
        _, keys = _exp_keys(logits_ptr, base, offs, end, temperature, row_max)
        if tl.max(((offs < end) & (keys >= lo) & (keys <= hi)).to(tl.int32), axis=0) > 0:
            part = start
            while part < tl.minimum(start + BLOCK_V, end):
                part_offs = part + tl.arange(0, BLOCK_S)
                e, key = _exp_keys(logits_ptr, base, part_offs, end, temperature, row_max)
                in_band = (part_offs < end) & (key >= lo) & (key <= hi)
                if tl.max(in_band.to(tl.int32), axis=0) > 0:
                    above = in_band[:, None] & (key[:, None] > probes[None, :])
                    cnt += tl.sum(above.to(tl.int32), axis=0)
                    mass += tl.sum(tl.where(above, e[:, None], 0.0), axis=0)
                part += BLOCK_S
        start += BLOCK_V
    return cnt, mass


@triton.jit(do_not_specialize=["split"])
def _stats_kernel(logits_ptr, temperature_ptr, scratch_ptr, fscratch_ptr, rows_per_request, split, slice_len,
                  V: tl.constexpr, BLOCK_V: tl.constexpr):
    """Per slice: online max and sum of exp(l - max), per lane, merged at the end; first index of the max."""
    row = tl.program_id(0).to(tl.int64)
    base = row * V
    temperature = tl.load(temperature_ptr + row // rows_per_request).to(tl.float32)
    m_vec = tl.full([BLOCK_V], float("-inf"), tl.float32)
    s_vec = tl.zeros([BLOCK_V], tl.float32)
    i_vec = tl.zeros([BLOCK_V], tl.int32)  # per lane, the first index holding its max
    start, end = _slice(slice_len, V)
    while start < end:
        offs = start + tl.arange(0, BLOCK_V)
        x = tl.load(logits_ptr + base + offs, mask=offs < end, other=float("-inf"))
        scaled = tl.math.div_rn(x, temperature)  # as in _exp_keys
        i_vec = tl.where(scaled > m_vec, offs, i_vec)
        m_new = tl.maximum(m_vec, scaled)
        m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)  # lanes that saw only -inf keep s = 0, no nan
        s_vec = s_vec * tl.exp(m_vec - m_ref) + tl.exp(scaled - m_ref)
        m_vec = m_new
        start += BLOCK_V
    slice_max = tl.max(m_vec, axis=0)
    total = tl.sum(s_vec * tl.exp(m_vec - tl.where(slice_max > float("-inf"), slice_max, 0.0)), axis=0)
    stats = row * 3 * split + tl.program_id(1)
    tl.store(fscratch_ptr + stats, slice_max)
    tl.store(fscratch_ptr + stats + split, total)
    tl.store(scratch_ptr + stats + 2 * split, tl.min(tl.where(m_vec == slice_max, i_vec, V), axis=0))


@triton.jit(do_not_specialize=["split", "p", "state_in", "state_out", "part_in", "part_out"])
def _search_kernel(logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, scratch_ptr, fscratch_ptr,
                   rows_per_request, split, slice_len, p, state_in, state_out, part_in, part_out, V: tl.constexpr,
                   G: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_S: tl.constexpr, MAX_SPLIT: tl.constexpr,
                   MAX_PASSES: tl.constexpr):
    """Search pass ``p`` of program ``(row, s)``: the row's state before it (program 0 stores it in slot
    ``state_out`` for the next launch), then slice ``s``'s counts and masses above the probes of the state's
    bracket (into slot ``part_out``). A row in one program (``split == 1``) runs all its remaining passes
    here, advancing in registers, and stores its final state. Rows done before only carry their state over."""
    row = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    before = state_in + row * 8
    now = state_out + row * 8
    if tl.load(scratch_ptr + before + 3, mask=p > 0, other=0) != 0:
        words = tl.arange(0, 8)
        tl.store(scratch_ptr + now + words, tl.load(scratch_ptr + before + words), mask=s == 0)
    else:
        temperature, top_k, top_p, min_key, greedy, settled = _request(
            temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row // rows_per_request, V)
        lo, hi, c_hi, done, m_hi, kept_mass, row_max, z = _row_state(
            scratch_ptr, fscratch_ptr, row, p, split, state_in, part_in, top_k, top_p, min_key, greedy, settled, V,
            G, MAX_SPLIT)
        q = p
        while (done == 0) & (q < tl.where(split == 1, MAX_PASSES, p + 1)):
            probes = _probes(lo, hi, G)
            cnt, mass = _count_above(logits_ptr, row * V, slice_len, V, temperature, row_max, lo, hi, probes, G,
                                     BLOCK_V, BLOCK_S)
            if split == 1:
                lo, hi, c_hi, done, m_hi, kept_mass = _advance(lo, hi, probes, c_hi, m_hi, cnt, mass, q, settled,
                                                               min_key, top_k, top_p, z, G)
            else:
                cells = part_out + (row * split + s) * 2 * G + tl.arange(0, G)
                tl.store(scratch_ptr + cells, cnt)
                tl.store(fscratch_ptr + cells + G, mass)
            q += 1
        lead = s == 0
        tl.store(scratch_ptr + now, lo, mask=lead)
        tl.store(scratch_ptr + now + 1, hi, mask=lead)
        tl.store(scratch_ptr + now + 2, c_hi, mask=lead)
        tl.store(scratch_ptr + now + 3, tl.where(split == 1, 1, done), mask=lead)  # one program: no more passes
        tl.store(fscratch_ptr + now + 4, m_hi, mask=lead)
        tl.store(fscratch_ptr + now + 5, kept_mass, mask=lead)
        tl.store(fscratch_ptr + now + 6, row_max, mask=lead)
        tl.store(fscratch_ptr + now + 7, z, mask=lead)


@triton.jit(do_not_specialize=["split", "state_in", "part_in"])
def _write_kernel(logits_ptr, out_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, scratch_ptr, fscratch_ptr,
                  rows_per_request, split, slice_len, state_in, part_in, V: tl.constexpr, G: tl.constexpr,
                  BLOCK_V: tl.constexpr, MAX_SPLIT: tl.constexpr, MAX_PASSES: tl.constexpr):
    """The slice's renormalised kept probabilities ``e / kept_mass`` where ``key >= tau``, or for greedy
    rows one-hot at the first argmax."""
    row = tl.program_id(0).to(tl.int64)
    base = row * V
    temperature, top_k, top_p, min_key, greedy, settled = _request(
        temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row // rows_per_request, V)
    tau, _, _, _, _, kept_mass, row_max, _ = _row_state(
        scratch_ptr, fscratch_ptr, row, MAX_PASSES, split, state_in, part_in, top_k, top_p, min_key, greedy, settled,
        V, G, MAX_SPLIT)
    argmax = V
    if greedy:
        argmax = _row_stats(scratch_ptr, fscratch_ptr, row * 3 * split, split, V, MAX_SPLIT)[2]
    start, end = _slice(slice_len, V)
    while start < end:
        offs = start + tl.arange(0, BLOCK_V)
        e, key = _exp_keys(logits_ptr, base, offs, end, temperature, row_max)
        probs = tl.where(key >= tau, e / kept_mass, 0.0)
        probs = tl.where(greedy, tl.where(offs == argmax, 1.0, 0.0), probs)
        tl.store(out_ptr + base + offs, probs, mask=offs < end)
        start += BLOCK_V


def prepare_target_probs(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: torch.Tensor,
    rows_per_request: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per row, ``softmax(logits / T)`` restricted to the tokens kept by joint top-k, top-p and min-p,
    renormalised (see the module docstring; ``sgl_eagle_triton.devtools.reference.target_probs`` spells it out).

    Args:
        logits:        [R, V] float32, contiguous; R = bs * rows_per_request.
        temperatures:  [bs] or [bs, 1] float (> 0), contiguous.
        top_ks:        [bs] int32 / int64 (``>= V``, e.g. SGLang's ``1 << 30``: no top-k).
        top_ps:        [bs] float in (0, 1] (1: no top-p).
        min_ps:        [bs] float in [0, 1) (0: no min-p).
        rows_per_request: rows of one request; request ``b`` owns rows ``b * rows_per_request ...``.
        out:           optional [R, V] float32 result; may be ``logits`` itself (in place).

    V is a compile-time constant of the kernels: one compilation per vocabulary size.

    Returns ``out`` (allocated when None). Rows with top_k = 1 (greedy) come out one-hot at the
    first argmax of ``logits / T``. CUDA-graph safe: no host sync; ``MAX_PASSES + 2`` launches on grid
    ``(R, SPLIT)``, 3 when ``SPLIT == 1``, whatever the data (``SPLIT`` depends on ``R`` and ``V`` only);
    allocates ``out`` (when None) and an int32 scratch of ``R * (3 * SPLIT + 16 + 4 * G * SPLIT)`` words.
    """
    R, V = logits.shape
    assert logits.dtype == torch.float32 and logits.is_contiguous()
    assert R % rows_per_request == 0
    bs = R // rows_per_request
    temperatures = temperatures.view(-1)
    for t in (temperatures, top_ks, top_ps, min_ps):
        assert t.is_contiguous() and t.numel() >= bs and t.device == logits.device
    if out is None:
        out = torch.empty_like(logits)
    assert out.shape == logits.shape and out.dtype == torch.float32 and out.is_contiguous()
    if R == 0 or V == 0:
        return out
    split, slice_len = row_slices(R, V, BLOCK_V, logits.device)
    # Scratch regions (int32 words; floats stored in place): [R, 3, split] slice statistics, then two slots
    # of [R, 8] search state and two of [R, split, 2, G] partial counts and masses; pass p writes slots p % 2.
    state = [3 * R * split + slot * 8 * R for slot in (0, 1)]
    part = [3 * R * split + 16 * R + slot * 2 * G * R * split for slot in (0, 1)]
    scratch = torch.empty(R * (3 * split + 16 + 4 * G * split), dtype=torch.int32, device=logits.device)
    common = (scratch, scratch.view(torch.float32), rows_per_request, split, slice_len)
    params = (temperatures, top_ks, top_ps, min_ps)
    grid = (R, split)
    num_warps = warps(device_info(logits.device), 256)  # 8 warps, 4 wavefronts
    _stats_kernel[grid](logits, temperatures, *common, V=V, BLOCK_V=BLOCK_V, num_warps=num_warps)
    passes = MAX_PASSES if split > 1 else 1  # a row in one program runs its whole search in one launch
    for p in range(passes):
        _search_kernel[grid](logits, *params, *common, p, state[(p + 1) % 2], state[p % 2], part[(p + 1) % 2],
                             part[p % 2], V=V, G=G, BLOCK_V=BLOCK_V, BLOCK_S=BLOCK_S, MAX_SPLIT=MAX_SPLIT,
                             MAX_PASSES=MAX_PASSES, num_warps=num_warps)
    last = (passes - 1) % 2
    _write_kernel[grid](logits, out, *params, *common, state[last], part[last], V=V, G=G, BLOCK_V=BLOCK_V,
                        MAX_SPLIT=MAX_SPLIT, MAX_PASSES=MAX_PASSES, num_warps=num_warps)
    return out
