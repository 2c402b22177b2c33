# shellcheck shell=sh
# Sourced by the GPU scripts (`. scripts/gpu-env.sh`): the environment burn's CUDA backend needs
# on a machine with an NVIDIA GPU.
#
# The NVRTC library that compiles burn's kernels: from the CUDA toolkit or PyTorch's wheel.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cuda_nvrtc", "lib") for p in nvidia.__path__))' 2>/dev/null); do
    [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH
export HOME="${HOME:-/tmp}"
# cubecl tries kernel variants at first use; every GPU measurement in docs/ ran with `minimal`.
export CUBECL_AUTOTUNE_LEVEL="${CUBECL_AUTOTUNE_LEVEL:-minimal}"
