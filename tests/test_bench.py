"""The benchmark harness's pure-Python part (report formatting) runs in CPU CI so it cannot rot."""

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("bench_kernels", Path(__file__).parent.parent / "bench" / "kernels.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_markdown_table_has_one_line_per_case():
    rows = []
    for impl, eager in (("triton (ours)", 5.0), ("sgl-kernel CUDA (stock)", 10.0)):
        for bs in (1, 8):
            rows.append(dict(op="build_tree", impl=impl, steps=5, topk=4, draft_tokens=16, batch=bs, eager_us=eager,
                             graph_us=eager / 2, graph_over_floor=100.0, sglang_version="0.5.17"))
    table = bench.markdown(rows, "GPU X", 3e12, 4.0)
    assert "# Tree kernels on GPU X, SGLang 0.5.17" in table
    lines = [line for line in table.splitlines() if line.startswith("| build_tree")]
    assert len(lines) == 2 and all("| 0.50 |" in line for line in lines)
