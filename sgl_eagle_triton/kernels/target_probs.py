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
``e >= 0``; ``max(e) = 1``, so min-p is simply ``e_i >= min_p``). One program per row finds ``tau``
without sorting the vocabulary, reading the logits (never a scratch copy) once per pass:

1. online max and sum of ``exp(l - max)``;
2. search passes, each testing ``G - 1`` probe keys at once inside the key bracket ``[lo, hi]`` that holds
   ``tau``: per probe, count and mass of the tokens above it, by ``[BLOCK_S, G]`` compares that chunks
   without a token of the bracket skip. The first probe at which the filters hold bounds the new bracket,
   ~G times narrower; the search stops once at most one token lies in it (that token is then kept), so
   typically after 2 to 4 passes at V = 128K (at most 6 for the 28 bits from 2**-32, where it starts,
   to 1; one more pass and a second descent when ``tau`` turns out to lie below 2**-32);
3. write ``e / S`` where ``key >= tau``, else 0; ``S``, the kept mass, comes out of the search.

Rows need no search when top-k and top-p are both off (``top_k >= V``, ``top_p >= 1``: one pass sums
``e >= min_p``, none when ``min_p == 0``). ``top_k == 1`` (SGLang's greedy requests inside sampled
batches) is one-hot at the first index of the largest ``logits / T``, exactly ``torch.argmax``: the
token greedy decoding picks, even at exact ties.
All sums are float32; the decisions and the output use the same sums, so the result is self-consistent.
"""

import torch
import triton
import triton.language as tl

from sgl_eagle_triton.kernels.tree_rows import pick

KEY_ONE = tl.constexpr(0x3F800000)  # int32 bits of 1.0f: the key of the row maximum, whose e = exp(0) = 1
FLOOR_KEY = tl.constexpr(0x2F800000)  # bits of 2**-32: searches start here and look lower only if needed


@triton.jit
def _scaled(x, temperature):
    """``logits / T``, correctly rounded as torch's; one helper so that every pass gets bit-identical values."""
    return tl.math.div_rn(x, temperature)


@triton.jit
def _exp_keys(logits_ptr, base, offs, V, temperature, row_max):
    """``e = exp(l - max)`` of a chunk (0 past the row end) and its monotone int32 keys."""
    x = tl.load(logits_ptr + base + offs, mask=offs < V, other=float("-inf"))
    e = tl.exp(_scaled(x, temperature) - row_max)
    return e, e.to(tl.int32, bitcast=True)


@triton.jit
def _target_probs_kernel(
    logits_ptr,
    out_ptr,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    rows_per_request,
    V: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_S: tl.constexpr,
    G: tl.constexpr,
    MAX_PASSES: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    request = row // rows_per_request
    base = row * V
    temperature = tl.load(temperature_ptr + request).to(tl.float32)
    top_k = tl.minimum(tl.maximum(tl.load(top_k_ptr + request).to(tl.int64), 1), V).to(tl.int32)
    top_p = tl.load(top_p_ptr + request).to(tl.float32)
    min_p = tl.load(min_p_ptr + request).to(tl.float32)

    # Pass 1: online max and sum of exp(l - max), per lane, merged at the end.
    lanes = tl.arange(0, BLOCK_V)
    m_vec = tl.full([BLOCK_V], float("-inf"), tl.float32)
    s_vec = tl.zeros([BLOCK_V], tl.float32)
    i_vec = tl.zeros([BLOCK_V], tl.int32)  # per lane, the first index holding its max
    for start in range(0, V, BLOCK_V):
        offs = start + lanes
        x = tl.load(logits_ptr + base + offs, mask=offs < V, other=float("-inf"))
        l = _scaled(x, temperature)
        i_vec = tl.where(l > m_vec, offs, i_vec)
        m_new = tl.maximum(m_vec, l)
        m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)  # lanes that saw only -inf keep s = 0, no nan
        s_vec = s_vec * tl.exp(m_vec - m_ref) + tl.exp(l - m_ref)
        m_vec = m_new
    row_max = tl.max(m_vec, axis=0)
    z_online = tl.sum(s_vec * tl.exp(m_vec - row_max), axis=0)
    argmax = tl.min(tl.where(m_vec == row_max, i_vec, V), axis=0)  # first index of the max, as torch.argmax

    # The kept set is {key >= tau}. Search state: tau lies in [lo, hi]; tokens with key < lo are dropped,
    # tokens with key > hi are kept (c_hi, m_hi: their count and mass).
    min_key = tl.where(min_p > 0.0, tl.minimum(min_p.to(tl.int32, bitcast=True), KEY_ONE), 0)
    greedy = top_k == 1
    settled = greedy | ((top_k >= V) & (top_p >= 1.0))  # no search: tau = lo, one pass sums its mass
    # A search starts at FLOOR_KEY (or min_key if higher); probe 0 of its first pass tests the floor.
    lo = tl.where(greedy, KEY_ONE, tl.where(settled, min_key, tl.maximum(min_key, FLOOR_KEY)))
    hi = KEY_ONE
    done = ((settled & (lo == 0)) | greedy).to(tl.int32)  # keep all (mass: the online sum), or greedy
    tau = lo
    kept_mass = z_online
    c_hi = 0
    m_hi = 0.0
    z = z_online
    probe_ids = tl.arange(0, G)
    s_lanes = tl.arange(0, BLOCK_S)
    passes = 0
    while (done == 0) & (passes < MAX_PASSES):
        settle = (settled | (lo >= hi)).to(tl.int32)
        # Probe 0 is lo - 1 (it counts the whole bracket); probes 1..G-1 split [lo, hi - 1] evenly.
        span = (hi - lo).to(tl.int64)
        spread = lo.to(tl.int64) + (span * probe_ids) // G
        dense = tl.minimum(lo.to(tl.int64) + probe_ids - 1, hi.to(tl.int64) - 1)
        probes = tl.where(probe_ids == 0, lo.to(tl.int64) - 1, tl.where(span >= G, spread, dense)).to(tl.int32)
        cnt = tl.zeros([G], tl.int32)  # per probe: tokens of the bracket above it
        mass = tl.zeros([G], tl.float32)
        band_mass = tl.zeros([BLOCK_S], tl.float32)
        z_vec = tl.zeros([BLOCK_S], tl.float32)
        for start in range(0, V, BLOCK_S):
            offs = start + s_lanes
            e, key = _exp_keys(logits_ptr, base, offs, V, temperature, row_max)
            z_vec += e
            in_band = (offs < V) & (key >= lo) & (key <= hi)
            band_mass += tl.where(in_band, e, 0.0)
            if settle == 0:
                if tl.max(in_band.to(tl.int32), axis=0) > 0:
                    above = in_band[:, None] & (key[:, None] > probes[None, :])
                    cnt += tl.sum(above.to(tl.int32), axis=0)
                    mass += tl.sum(tl.where(above, e[:, None], 0.0), axis=0)
        z = tl.where(passes == 0, tl.sum(z_vec, axis=0), z)
        if settle != 0:
            tau = lo
            kept_mass = m_hi + tl.sum(band_mass, axis=0)
            done = settle
        else:
            # f(t): "count above t < top_k and mass above t <= top_p * z" (min-p holds: t >= lo >= min_key).
            mass_limit = tl.where(top_p >= 1.0, float("inf"), top_p * z)
            count_above = c_hi + cnt
            mass_above = m_hi + mass
            # Probe 0 is a candidate only in the first pass and above min_key, i.e. when it tests the floor.
            lowest = tl.where((passes == 0) & (lo > min_key), 0, 1)
            ok = (count_above < top_k) & (mass_above <= mass_limit) & (probe_ids >= lowest)
            first = tl.min(tl.where(ok, probe_ids, G), axis=0)  # G: none but hi itself
            # f fails at probe first - 1 and holds at probe first (or at hi): tau lies in between. first == 0:
            # f holds at the floor already, tau lies in [min_key, floor - 1].
            prev = tl.maximum(first - 1, 0)
            prev_count = c_hi + pick(cnt, probe_ids, prev)
            kept_mass = m_hi + pick(mass, probe_ids, prev)
            hit = first < G
            new_hi = tl.where(hit, pick(probes, probe_ids, first), hi)
            c_hi = tl.where(hit, c_hi + pick(cnt, probe_ids, first), c_hi)
            m_hi = tl.where(hit, m_hi + pick(mass, probe_ids, first), m_hi)
            lo = tl.where(first == 0, min_key, pick(probes, probe_ids, prev) + 1)
            hi = new_hi
            tau = lo
            # At most one token in [lo, hi]: f holds at its key as at hi (same tokens above it), so it is
            # kept, and tau = lo with kept mass = mass above prev.
            done = ((first > 0) & ((prev_count - c_hi <= 1) | (lo >= hi))).to(tl.int32)
        passes += 1

    # Final pass: renormalised kept probabilities.
    for start in range(0, V, BLOCK_V):
        offs = start + lanes
        e, key = _exp_keys(logits_ptr, base, offs, V, temperature, row_max)
        probs = tl.where(key >= tau, e / kept_mass, 0.0)
        probs = tl.where(greedy, tl.where(offs == argmax, 1.0, 0.0), probs)
        tl.store(out_ptr + base + offs, probs, mask=offs < V)


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
    renormalised (see the module docstring; ``sgl_eagle_triton.reference.target_probs`` spells it out).

    Args:
        logits:        [R, V] float32, contiguous; R = bs * rows_per_request.
        temperatures:  [bs] or [bs, 1] float (> 0), contiguous.
        top_ks:        [bs] int32 / int64 (``>= V``, e.g. SGLang's ``1 << 30``: no top-k).
        top_ps:        [bs] float in (0, 1] (1: no top-p).
        min_ps:        [bs] float in [0, 1) (0: no min-p).
        rows_per_request: rows of one request; request ``b`` owns rows ``b * rows_per_request ...``.
        out:           optional [R, V] float32 result; may be ``logits`` itself (in place).

    V is a compile-time constant of the kernel: one compilation per vocabulary size.

    Returns ``out`` (allocated when None). Rows with top_k = 1 (greedy) come out one-hot at the
    first argmax of ``logits / T``. CUDA-graph safe: no host sync, no allocation but
    ``out``, grid ``(R,)``.
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
    _target_probs_kernel[(R,)](
        logits,
        out,
        temperatures,
        top_ks,
        top_ps,
        min_ps,
        rows_per_request,
        V=V,
        BLOCK_V=2048,
        BLOCK_S=512,
        G=32,
        MAX_PASSES=12,
        num_warps=8,
    )
    return out
