#!/usr/bin/env bash
# Build the offline wheel bundle that lets SGLang 0.5.17 run on an air-gapped Hopper (H100/H200) GPU host
# whose image already has Python 3.12, torch 2.11.0+cu130, triton 3.6.0 and transformers 5.17.
#
# Usage, from the root of this repository:
#     bash tools/gpu_wheelhouse.sh [DEST]          # DEST defaults to .whl
#
# Needs on this machine: python3 >= 3.10 whose pip reaches PyPI, nvcc 13.x (CUDA_HOME, or nvcc on PATH)
# with a C++ compiler, and about 6 GB free under /tmp. No GPU.
#
# Steps: download the pinned wheels (hash-checked) -> slim sglang-kernel, torchvision and sglang and apply
# the sglang source patches (repack.py) -> prebuild SGLang's JIT CUDA kernels for sm_90a in a throwaway
# build environment (prebuild_jit.py) -> write MANIFEST.txt -> verify -> replace DEST's files -> git-ignore
# DEST. A DEST that already verifies is left untouched. docs/gpu.md tells how to use it.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
lib=$here/gpu_wheelhouse
dest=${1:-.whl}
python=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PYTHONDONTWRITEBYTECODE=1

log() { printf '\n== %s\n' "$*"; }
die() { printf 'gpu_wheelhouse: %s\n' "$*" >&2; exit 1; }

# Add DEST to the repository's .git/info/exclude unless git ignores it already (no-op outside a repository).
ignore_dest() {
  git rev-parse --is-inside-work-tree >/dev/null 2>&1 || return 0
  local top rel exclude
  top=$(git rev-parse --show-toplevel)
  rel=$(realpath -m --relative-to="$top" "$dest")
  case $rel in ..|../*) return 0 ;; esac
  git -C "$top" check-ignore -q "$rel/" && return 0
  exclude=$(cd "$top" && realpath -m "$(git rev-parse --git-path info/exclude)")
  mkdir -p "$(dirname "$exclude")"
  printf '/%s/\n' "$rel" >>"$exclude"
  echo "added /$rel/ to $exclude"
}

# --- a complete DEST is only verified -----------------------------------------------------------------
command -v "$python" >/dev/null || die "$python not found (set PYTHON to a Python >= 3.10)"
[ ! -e "$dest" ] || [ -d "$dest" ] || die "$dest exists and is not a folder"
if [ -d "$dest" ] && [ -n "$(ls -A "$dest")" ]; then
  if "$python" "$lib/verify.py" "$dest"; then
    ignore_dest
    exit 0
  fi
  foreign=$(find "$dest" -mindepth 1 -maxdepth 1 ! -name '*.whl' ! -name '*.tar.xz' ! -name MANIFEST.txt)
  [ -z "$foreign" ] || die "$dest holds files this tool did not make, stopping: $foreign"
  echo "(re)building $dest"
fi

# --- prerequisites ------------------------------------------------------------------------------------
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || die "$python is older than 3.10"
if [ -z "${CUDA_HOME:-}" ]; then
  command -v nvcc >/dev/null || die "nvcc not found: install the CUDA 13 toolkit or set CUDA_HOME"
  # nvcc may be a wrapper script; its dry run names the real toolkit root.
  top=$(nvcc --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' || true)
  [ -n "$top" ] || die "cannot tell where nvcc's toolkit lives: set CUDA_HOME"
  CUDA_HOME=$(realpath "$top")
fi
export CUDA_HOME
nvcc_version=$("$CUDA_HOME/bin/nvcc" --version) || die "cannot run $CUDA_HOME/bin/nvcc"
[[ $nvcc_version == *"release 13."* ]] || die "$CUDA_HOME/bin/nvcc is not CUDA 13.x (the host runs CUDA 13.0)"
command -v c++ >/dev/null || die "no C++ compiler (c++) for the JIT kernels"

scratch=$(mktemp -d /tmp/gpu-wheelhouse.XXXXXX)
trap 'rm -rf "$scratch"' EXIT

# --- 1. download --------------------------------------------------------------------------------------
log "1/5 downloading the pinned wheels for CPython 3.12 / manylinux x86_64 (about 450 MB)"
"$python" "$lib/bundle.py" requirements >"$scratch/requirements.txt"
# Every platform tag a glibc 2.34 host accepts: older pips don't widen manylinux_2_34 to the older tags.
platforms=()
for minor in $(seq 34 -1 5); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
"$python" -m pip download --quiet --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --abi cp312 "${platforms[@]}" \
  --require-hashes -r "$scratch/requirements.txt" -d "$scratch/download"

# --- 2. repack ----------------------------------------------------------------------------------------
log "2/5 slimming sglang-kernel, torchvision and sglang; patching sglang"
"$python" "$lib/repack.py" "$scratch/download" "$scratch/out"
rm -rf "$scratch/download"

# --- 3. build environment for the JIT prebuild --------------------------------------------------------
log "3/5 installing the JIT build environment (torch 2.11.0 with its CUDA libraries, about 3 GB)"
"$python" -m pip install --quiet --no-warn-conflicts --target "$scratch/buildenv" \
  -r "$lib/jit-build-env.txt"
"$python" -m zipfile -e "$scratch"/out/sglang-[0-9]*.whl "$scratch/sglang"

# --- 4. JIT prebuild ----------------------------------------------------------------------------------
log "4/5 prebuilding SGLang's JIT kernels for sm_90a with $CUDA_HOME/bin/nvcc"
echo "(SGLang's warning 'Cannot detect CUDA architecture' is expected here: there is no GPU)"
mkdir "$scratch/jit"
TVM_FFI_CACHE_DIR=$scratch/jit PYTHONNOUSERSITE=1 PYTHONPATH=$scratch/sglang:$scratch/buildenv \
  PATH=$scratch/buildenv/bin:$PATH "$python" "$lib/prebuild_jit.py" "$scratch/out"

# --- 5. manifest, checks, install into DEST -----------------------------------------------------------
log "5/5 MANIFEST.txt, checks, $dest"
"$python" "$lib/manifest.py" "$scratch/out"
"$python" "$lib/verify.py" "$scratch/out"
mkdir -p "$dest"
find "$dest" -mindepth 1 -maxdepth 1 \( -name '*.whl' -o -name '*.tar.xz' -o -name MANIFEST.txt \) -delete
cp "$scratch"/out/* "$dest"/
"$python" "$lib/verify.py" "$dest"
ignore_dest
