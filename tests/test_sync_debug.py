"""tools/sync_debug (a diagnostic): the warnings torch's sync debug mode raises are counted by stack, those inside a
scheduler's event loop apart, and summarised per process."""

import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parent.parent / "tools" / "sync_debug"

SCRIPT = """
import sitecustomize, warnings
sitecustomize._hook()
def event_loop_overlap():
    for _ in range(3):
        warnings.warn("called a synchronizing CUDA operation", UserWarning)
event_loop_overlap()
warnings.warn("called a synchronizing CUDA operation", UserWarning)
warnings.warn("something else", UserWarning)
sitecustomize._write()
"""


def test_sync_warnings_are_counted_by_stack_and_summarised(tmp_path):
    out = tmp_path / "sync"
    env = {"PYTHONPATH": str(TOOL), "SYNC_DEBUG_OUT": str(out), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "something else" in done.stderr and "synchronizing" not in done.stderr  # others still printed
    sys.path.insert(0, str(TOOL))
    try:
        import summarize
    finally:
        sys.path.remove(str(TOOL))
    (dump,) = out.glob("*.json")
    lines = summarize.summary(dump)
    assert lines[0].startswith(f"{dump.stem}: loop 3, init 1: -c")
    assert lines[1].startswith("    3 loop <string>:6:event_loop_overlap")
    assert lines[2].startswith("    1 init <string>:8:<module>")
    quiet = subprocess.run([sys.executable, "-c", "import sitecustomize; print(hasattr(sitecustomize, '_hook'))"],
                           env={**env, "SYNC_DEBUG_OUT": ""}, capture_output=True, text=True, timeout=60)
    assert quiet.stdout.strip() == "False"  # without the variable it does nothing
