"""What the demo, the tests and the benchmarks use; a server never imports from here.

- ``demo``: ``python -m sgl_eagle_triton demo`` (serves ``assets/tiny-code-v1`` by default)
- ``launcher``: stdlib-only ``sglang.launch_server`` launcher and HTTP client (demo, e2e tests, benchmarks)
- ``tiny_models``: random-weight tiny Llama targets and EAGLE / EAGLE-3 drafts
- ``testing``: random drafts, batches and draft trees for kernel tests and benchmarks
- ``reference/``: plain-PyTorch twins of every kernel (test and benchmark oracles)
- ``assets/tiny-code-v1``: a trained tiny Llama target + EAGLE-3 draft (accepts about 2 tokens per step)
"""

from pathlib import Path

TRAINED_PAIR = Path(__file__).parent / "assets" / "tiny-code-v1"
