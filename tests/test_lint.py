"""ruff (rules E, F, W, B, I; configured in pyproject.toml) finds nothing in the repository."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_clean():
    if os.environ.get("CI") != "true":  # CI installs it (requirements-test.txt); a bare GPU host may not have it
        pytest.importorskip("ruff")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)], capture_output=True,
                          text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
