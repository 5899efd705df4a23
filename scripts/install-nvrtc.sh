#!/usr/bin/env bash
# Installs NVRTC (the CUDA runtime compiler) and the CUDA headers from NVIDIA's
# pip wheels into DIR (default: .cuda-wheels in the repository), so that the
# CUDA kernels can be compiled and checked on a machine without a GPU or a
# CUDA toolkit. Idempotent: a second run only prints the settings.
#
#   scripts/install-nvrtc.sh [DIR]
#   env="$(scripts/install-nvrtc.sh)" && eval "$env"
#
# Prints (on stdout, nothing else goes there) the LD_LIBRARY_PATH entry for
# libnvrtc and AUTOPAR_CUDA_INCLUDE (the folder with cuda_bf16.h), as
# `export` lines.
set -euo pipefail

NVRTC_WHEEL="nvidia-cuda-nvrtc-cu12==12.9.86"
RUNTIME_WHEEL="nvidia-cuda-runtime-cu12==12.9.79"

repo="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$repo/.cuda-wheels}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
lib="$dir/nvidia/cuda_nvrtc/lib"
include="$dir/nvidia/cuda_runtime/include"

if [[ ! -e "$lib/libnvrtc.so.12" || ! -e "$include/cuda_bf16.h" ]]; then
    pip="$(command -v pip3 || command -v pip || true)"
    if [[ -z "$pip" ]]; then
        echo "install-nvrtc.sh: pip is needed to fetch $NVRTC_WHEEL" >&2
        exit 1
    fi
    echo "installing $NVRTC_WHEEL and $RUNTIME_WHEEL into $dir" >&2
    "$pip" install --quiet --disable-pip-version-check --no-cache-dir --no-deps --upgrade --target "$dir" \
        "$NVRTC_WHEEL" "$RUNTIME_WHEEL" >&2
fi
if [[ ! -e "$lib/libnvrtc.so.12" || ! -e "$include/cuda_bf16.h" ]]; then
    echo "install-nvrtc.sh: the wheels did not provide $lib/libnvrtc.so.12 and $include/cuda_bf16.h" >&2
    exit 1
fi
# cudarc's loader tries libnvrtc.so before the versioned names.
[[ -e "$lib/libnvrtc.so" ]] || ln -s libnvrtc.so.12 "$lib/libnvrtc.so"

echo "export LD_LIBRARY_PATH=\"$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
echo "export AUTOPAR_CUDA_INCLUDE=\"$include\""
