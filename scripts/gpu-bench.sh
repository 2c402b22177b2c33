#!/bin/sh
# The GPU measurements of docs/performance.md's "On a GPU" section, run on a machine with an NVIDIA GPU.
#
#   BIN=target/release/iota TEST=<cuda_smoke test binary> OUT=results sh scripts/gpu-bench.sh
#
# Build both on any x86-64 machine (the CUDA libraries are loaded at run time, so the build
# machine needs no GPU or toolkit; CUDARC_CUDA_VERSION names the toolkit the GPU machine has):
#
#   CUDARC_CUDA_VERSION=13000 cargo build --release --features cuda
#   CUDARC_CUDA_VERSION=13000 cargo test --release --features cuda --test cuda_smoke --no-run
#
# A first run of each model shape spends minutes compiling burn's kernels (NVRTC, one CPU
# thread per process), so the script runs in two phases:
#   1. cold: every job at once, each compiling its kernels on its own core into an on-disk
#      kernel cache of its own (see `in_dir`). Their timed batches may overlap with each other
#      on the GPU, so phase 1's throughput numbers are not clean; its first-batch times are
#      the cold-start cost.
#   2. warm: the benches again, one at a time with nothing else running: their first-batch
#      time is a start with the kernel cache filled, their throughput the clean number; each
#      times the flat optimizer step against the parameter-by-parameter one on the same
#      gradients. PyTorch's twin runs on the same card between them (skipped where
#      `import torch` fails).
# SMALL and BIG name the two presets (`small`, `1b`) and DEVICE the device, so that the script
# can be tried end to end on a CPU with tiny ones: SMALL=tiny BIG=tiny DEVICE=cpu.
# BIN, TEST and OUT must be absolute paths. Each job has its own time limit and log under
# $OUT; summary.txt has each log's tail and every job's start and end (seconds since the
# script began).
set -u
BIN=${BIN:-target/release/iota}
OUT=${OUT:-gpu-results}
PEAK=${PEAK:-989}            # dense bf16 TFLOP/s of an H100 SXM (the H200's is the same)
COLD=${COLD:-320}            # phase 1's time limit per job, in seconds
DEADLINE=${DEADLINE:-540}    # no job runs past this many seconds after the start
SMALL=${SMALL:-small}
BIG=${BIG:-1b}
DEVICE=${DEVICE:-cuda}
SEQ=${SEQ:-128}              # tokens per window of the `small` jobs (a CPU try with tiny: 64)
WORK=${WORK:-/tmp/iota-gpu-work}
mkdir -p "$OUT" "$WORK"
T0=$(date +%s)

# The CUDA libraries' paths and cubecl's settings.
# shellcheck source=scripts/gpu-env.sh
. "$(dirname "$0")/gpu-env.sh"

{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    echo "CUBECL_AUTOTUNE_LEVEL=$CUBECL_AUTOTUNE_LEVEL LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
} >"$OUT/summary.txt" 2>&1

run() { # name, seconds, command...
    name=$1 limit=$2
    shift 2
    start=$(($(date +%s) - T0))
    [ $((DEADLINE - start)) -lt "$limit" ] && limit=$((DEADLINE - start))
    [ "$limit" -le 0 ] && { echo "== $name: skipped (deadline)" >>"$OUT/summary.txt"; return; }
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    {
        echo "== $name: $*"
        tail -n 30 "$OUT/$name.log"
        echo "== $name: exit $rc, from $start s to $(($(date +%s) - T0)) s"
    } >>"$OUT/summary.txt"
}
# cubecl keeps its kernel cache in the `target/` beside the nearest Cargo.toml: each job gets a
# folder of its own (a lone Cargo.toml marks it), since every insert into the cache file rereads
# the whole file under a lock, which jobs sharing one file would wait on.
in_dir() { # folder, command...
    d="$WORK/$1"
    shift
    mkdir -p "$d" && touch "$d/Cargo.toml" && (cd "$d" && "$@")
}
model() { # name, seconds, preset, float, batch, seq, iters
    run "$1" "$2" "$BIN" bench model --preset "$3" --device "$DEVICE" --float "$4" \
        --batch-size "$5" --seq-len "$6" --iters "$7" --peak-tflops "$PEAK"
}
# bf16 exists on the GPU only; a CPU try runs those jobs in f32.
BF16=bf16
[ "$DEVICE" = cuda ] || BF16=f32

# Phase 1: cold, all at once.
in_dir f32 model small-f32-cold "$COLD" "$SMALL" f32 8 "$SEQ" 10 &
[ -n "${TEST:-}" ] && in_dir smoke run smoke "$COLD" "$TEST" --test-threads 1 --nocapture &
# A cold network: each miner compiles its kernels in its warm-up, before it asks for work.
in_dir local run local "$COLD" "$BIN" local --device "$DEVICE" --preset "$SMALL" --miners-per-section 1 \
    --samples 80 --merge-every 40 --seq-len "$SEQ" --batch-size 8 --poll-ms 100 --dir "$WORK/local-run" \
    --summary-out "$OUT/local.json" &
# `1b` cold, to fill its kernel and autotune caches for the profile in phase 2 (on
# 2026-11-27 a cold run under the profiler panicked in the matmul autotuner's benchmark of a
# candidate and hung until its time limit).
in_dir 1b model 1b-bf16-cold "$COLD" "$BIG" "$BF16" 4 1024 1 &
wait
pkill -x "$(basename "$BIN")" 2>/dev/null # anything of `iota local` that outlived its time limit (by process name: `-f` would match this script's own command line)
du -sh "$WORK"/*/target/* 2>/dev/null >>"$OUT/summary.txt"

# Phase 2: warm cache, one at a time (most wanted first: the deadline may cut the last ones).
twin() { # name, seconds, preset, dtype, batch, seq, steps
    python3 -c 'import torch' 2>/dev/null && run "torch-$1" "$2" python3 \
        benches/torch_twin.py --preset "$3" --device "$DEVICE" --dtype "$4" --batch-size "$5" \
        --seq-len "$6" --steps "$7"
}
in_dir f32 model small-f32-warm 60 "$SMALL" f32 8 "$SEQ" 10
twin small-f32 40 "$SMALL" f32 8 "$SEQ" 20
# The single process and a 3 x 1 network on the one GPU, in the folder whose kernel cache the
# cold network filled.
in_dir local run network 90 "$BIN" bench network --device "$DEVICE" --preset "$SMALL" \
    --samples 40 --batch-size 8 --seq-len "$SEQ"
in_dir 1b model 1b-bf16-warm 120 "$BIG" "$BF16" 4 1024 3
twin 1b-bf16 60 "$BIG" bf16 4 1024 5
# Per-kernel GPU time of one `1b` batch with the caches filled (cubecl's profiler times each
# kernel, so the totals are not clean throughput): where its forward and backward, 3.3x
# PyTorch's whole step on 2026-11-27, spend their time, and why the flat step is slow there.
CUBECL_DEBUG_LOG="$OUT/profile-1b.log" CUBECL_DEBUG_OPTION=profile \
    in_dir 1b model 1b-bf16-profile 90 "$BIG" "$BF16" 4 1024 1
xz -9 -T0 "$OUT/profile-1b.log" 2>/dev/null
nvidia-smi >>"$OUT/summary.txt" 2>&1
exit 0
