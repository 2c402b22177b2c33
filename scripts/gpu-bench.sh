#!/bin/sh
# The GPU measurements of the README's "On a GPU" section, run on a machine with an NVIDIA GPU.
#
#   BIN=target/release/iota TEST=<cuda_smoke test binary> OUT=results sh scripts/gpu-bench.sh
#
# Build both on any x86-64 machine (the CUDA libraries are loaded at run time, so the build
# machine needs no GPU or toolkit; CUDARC_CUDA_VERSION names the toolkit the GPU machine has):
#
#   CUDARC_CUDA_VERSION=13000 cargo build --release --features cuda
#   CUDARC_CUDA_VERSION=13000 cargo test --release --features cuda --test cuda_smoke --no-run
#
# Each step has its own time limit and its own log under $OUT, so one failure does not hide the
# others. PyTorch (for the twin) is optional: its rows are skipped where `import torch` fails.
set -u
BIN=${BIN:-target/release/iota}
OUT=${OUT:-gpu-results}
PEAK=${PEAK:-989}            # dense bf16 TFLOP/s of an H100 SXM (the H200's is the same)
STEPS=${STEPS:-all}
mkdir -p "$OUT"

# The NVRTC library that compiles burn's kernels: from the CUDA toolkit or PyTorch's wheel.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cuda_nvrtc", "lib") for p in nvidia.__path__))' 2>/dev/null); do
    [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH
# burn caches autotune results and compiled kernels under ./target (the first run of each
# shape compiles its kernels with NVRTC: minutes, not counted in the timed batches).
export HOME=${HOME:-/tmp}
export CUBECL_AUTOTUNE_LEVEL=${CUBECL_AUTOTUNE_LEVEL:-minimal}
echo "CUBECL_AUTOTUNE_LEVEL=$CUBECL_AUTOTUNE_LEVEL"

run() { # name, seconds, command...
    name=$1 limit=$2
    shift 2
    case " $STEPS " in *" $name "* | " all ") ;; *) return ;; esac
    echo "== $name: $*" | tee -a "$OUT/summary.txt"
    start=$(date +%s)
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    tail -n 25 "$OUT/$name.log" >>"$OUT/summary.txt"
    echo "== $name: exit $rc after $(($(date +%s) - start)) s" | tee -a "$OUT/summary.txt"
}

{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    ls /proc/driver/nvidia/version
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    ls $(echo "$LD_LIBRARY_PATH" | tr ':' ' ') 2>/dev/null | grep -m3 nvrtc
} >"$OUT/summary.txt" 2>&1

if python3 -c 'import torch' 2>/dev/null; then
    for f in f32 bf16; do
        run "torch-small-$f" 120 python3 benches/torch_twin.py --preset small --device cuda \
            --dtype "$f" --batch-size 8 --seq-len 128 --steps 20
        run "torch-small-big-$f" 120 python3 benches/torch_twin.py --preset small --device cuda \
            --dtype "$f" --batch-size 64 --seq-len 512 --steps 10
    done
    run torch-1b-bf16 180 python3 benches/torch_twin.py --preset 1b --device cuda --dtype bf16 \
        --batch-size 4 --seq-len 1024 --steps 5
fi
for f in f32 bf16; do
    run "small-$f" 200 "$BIN" bench model --preset small --device cuda --float "$f" \
        --batch-size 8 --seq-len 128 --iters 10 --peak-tflops "$PEAK"
    run "small-big-$f" 240 "$BIN" bench model --preset small --device cuda --float "$f" \
        --batch-size 64 --seq-len 512 --iters 10 --peak-tflops "$PEAK"
done
[ -n "${TEST:-}" ] && run smoke 200 "$TEST" --test-threads 1 --nocapture
run local 240 "$BIN" local --device cuda --preset small --samples 200 --seq-len 128 \
    --batch-size 8 --poll-ms 100 --dir /tmp/iota-local-gpu --summary-out "$OUT/local.json"
run 1b-bf16 400 "$BIN" bench model --preset 1b --device cuda --float bf16 \
    --batch-size 4 --seq-len 1024 --iters 3 --peak-tflops "$PEAK"
exit 0
