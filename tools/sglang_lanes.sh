#!/usr/bin/env bash
# The glue, config, plugin and demo tests on every served SGLang release besides the one the main suite ran on (CPU only).
#   bash tools/sglang_lanes.sh [VERSION ...]     default: 0.5.18 ... 0.5.23
# Each release runs with a torch it can import: 0.5.18 / 0.5.19 (which pin torch 2.13) beside the main suite's
# torch 2.11 and transformers 5.12.1 (their own pins), 0.5.20 ... 0.5.23 in a virtual environment of SGLang 0.5.23's
# pins (torch 2.14.1, transformers 5.19.0; 0.5.20 ... 0.5.22 pin torch 2.13). A release other than the environment's
# own is laid over it on PYTHONPATH (its wheel unpacked, no dependencies), so that one environment serves several.
# Wheels, unpacked releases and the 0.5.23 environment are cached under $SGL_LANES_CACHE (default ~/.cache/sgl-lanes).
set -uo pipefail
cd "$(dirname "$0")/.."
cache=${SGL_LANES_CACHE:-$HOME/.cache/sgl-lanes}
lanes=("${@:-0.5.18 0.5.19 0.5.20 0.5.21 0.5.22 0.5.23}")
read -r -a lanes <<<"${lanes[*]}"
tests=(tests/test_glue.py tests/test_plugin.py tests/test_worker.py tests/test_verify_glue.py tests/test_relay.py tests/test_off_step.py
       tests/test_graph_epilogue.py
       tests/test_demo.py)
newest=0.5.23
mkdir -p "$cache"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1

unpacked() {  # the release's wheel, unpacked (no dependencies): a folder to put first on PYTHONPATH
  local dir=$cache/sglang-$1
  if [ ! -f "$dir/.complete" ]; then
    rm -rf "$dir" && mkdir -p "$dir" || return 1
    python3 -m pip download -q --no-deps --only-binary=:all: -d "$cache/wheels" "sglang==$1" || return 1
    python3 -m zipfile -e "$(ls "$cache"/wheels/sglang-"$1"-*.whl | head -1)" "$dir" && touch "$dir/.complete"
  fi
  echo "$dir"
}

newest_env() {  # a virtual environment of SGLang $newest and its pins, with this package installed (editable)
  local venv=$cache/venv-$newest
  if [ ! -f "$venv/.complete" ]; then
    rm -rf "$venv" && python3 -m venv "$venv" || return 1
    "$venv/bin/pip" install -q -r "requirements-test-$newest.txt" || return 1
    "$venv/bin/pip" install -q --no-deps "sglang==$newest" || return 1
    touch "$venv/.complete"
  fi
  "$venv/bin/pip" install -q --no-deps -e . >/dev/null || return 1
  echo "$venv/bin/python3"
}

passed=0 failed=0
for version in "${lanes[@]}"; do
  case $version in
    0.5.18|0.5.19) python=python3 ;;
    *) python=$(newest_env) || { echo "lane $version: no environment" >&2; failed=$((failed + 1)); continue; } ;;
  esac
  overlay=""
  if [ "$version" != "$newest" ]; then
    overlay=$(unpacked "$version") || { echo "lane $version: no wheel" >&2; failed=$((failed + 1)); continue; }
  fi
  echo "== SGLang $version lane ($("$python" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null))"
  if PYTHONPATH="$overlay" "$python" -m pytest -q -p no:cacheprovider "${tests[@]}"; then
    passed=$((passed + 1))
  else
    echo "lane $version FAILED" >&2
    failed=$((failed + 1))
  fi
done
echo "SGLang lanes green: ${passed} of $((passed + failed))"
[ "$failed" -eq 0 ]
