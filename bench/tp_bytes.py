"""Bytes each tensor-parallel rank sends per draft forward: the LM head's exchange (ours vs stock) and the hidden-state
all-reduces both pay, for Llama-3.1-8B / 70B EAGLE-3 draft shapes. Counted from what each side exchanges, not
measured:

- stock SGLang 0.5.17: its logits processor all-gathers each rank's logits shard, ``rows x draft_vocab / tp`` in
  the logits' dtype (bf16: the LM head's GEMM output; fp32 with ``--enable-fp32-lm-head``), before its top-k;
- ours (``FusedDrafter._lm_head``): each rank's ``k`` best (int64 key: logit and id) and its sum (fp32) per row,
  ``rows x (8 k + 4)``, all-gathered;
- both: three all-reduces of ``rows x hidden`` in the model's dtype (the vocabulary-parallel embedding, o-proj and
  down); an all-reduce sends about ``2 (tp - 1) / tp`` times its size per rank (ring), the all-gathers
  ``(tp - 1) / tp`` of the gathered tensor.

    python -m bench.tp_bytes            # markdown table
"""

from __future__ import annotations

SHAPES = {"llama-3.1-8b-eagle3": dict(hidden=4096, draft_vocab=32000),
          "llama-3.1-70b-eagle3": dict(hidden=8192, draft_vocab=32000)}


def bytes_per_forward(rows: int, topk: int, hidden: int, draft_vocab: int, tp: int, dtype_bytes: int = 2,
                      logits_bytes: int = 2) -> dict[str, float]:
    """Bytes one rank sends in one draft forward of ``rows`` rows (batch x topk): ``ours_lm_head``,
    ``stock_lm_head`` and ``all_reduces`` (paid by both)."""
    gather = (tp - 1) / tp  # a ring all-gather: each rank sends every other rank's share once
    return {
        "ours_lm_head": gather * tp * rows * (8 * topk + 4),
        "stock_lm_head": gather * rows * draft_vocab * logits_bytes,
        "all_reduces": 3 * 2 * gather * rows * hidden * dtype_bytes,
    }


def table() -> str:
    lines = ["| draft | tp | batch x topk | ours LM head B | stock LM head B | ours / stock | all-reduces B (both) |",
             "|---|---|---|---|---|---|---|"]
    for name, shape in SHAPES.items():
        for tp in (2, 4, 8):
            for bs, topk in ((1, 8), (8, 8), (32, 8), (32, 1)):
                b = bytes_per_forward(bs * topk, topk, tp=tp, **shape)
                lines.append(f"| {name} | {tp} | {bs} x {topk} | {b['ours_lm_head']:,.0f} | {b['stock_lm_head']:,.0f} "
                             f"| 1/{b['stock_lm_head'] / b['ours_lm_head']:.0f} | {b['all_reduces']:,.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(table())
