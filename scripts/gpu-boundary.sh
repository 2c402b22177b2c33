#!/bin/sh
# The `1b` geometry's boundary cost on a GPU (docs/learning.md, "The `1b` geometry on a GPU"):
# `iota train` of `1b` (d_model 2048, 16 blocks in 3 sections, no re-embedding) with its 64x
# bottleneck and without it, side by side on one GPU, on real text, for a fixed wall-clock
# budget. Both runs get SIGTERM at STOP_AT seconds: `iota train` then stops after its step in
# progress, evaluates, saves and ablates (src/cmd/stop_request.rs). Compare them at the steps
# both reached (their metrics files hold the held-out loss every EVAL steps).
#
#   BIN=/abs/iota DATA=/abs/texts OUT=/abs/results sh scripts/gpu-boundary.sh
#
# A cold start compiles burn's kernels for minutes (one CPU thread per process): on 2026-11-29
# the 64x run's first step ended 440 s after it started, the budget's whole length. So the
# script packs both runs' kernel caches into $OUT/kernels.tar.gz.NN pieces (when KERNELS_OUT is
# 1, the default), and KERNELS_IN=/abs/kernels.tar.gz seeds both runs with such a cache (the
# pieces joined with `cat`), so that a later GPU session can start warm.
#
# Build BIN on any x86-64 machine: `CUDARC_CUDA_VERSION=13000 cargo build --release --features
# cuda` (the CUDA libraries are loaded at run time). DATA is a text file or a folder of them;
# the byte-level tokenizer is used, so the vocabulary is 256. A CPU try of the script itself:
# PRESET=tiny DEVICE=cpu BATCH=2 SEQ=32 STOP_AT=20 sh scripts/gpu-boundary.sh
set -u
BIN=${BIN:-target/release/iota}
DATA=${DATA:?DATA names the training text}
OUT=${OUT:-gpu-results}
PRESET=${PRESET:-1b}
DEVICE=${DEVICE:-cuda}
BATCH=${BATCH:-8}
SEQ=${SEQ:-512}
LR=${LR:-0.0006}
STEPS=${STEPS:-100000}        # the cosine's length; the runs are stopped long before
EVAL=${EVAL:-20}
STOP_AT=${STOP_AT:-440}       # seconds after the start at which both runs are asked to stop
GRACE=${GRACE:-130}           # seconds they then have to evaluate, save and ablate
WORK=${WORK:-/tmp/iota-gpu-boundary}
KERNELS_IN=${KERNELS_IN:-}
KERNELS_OUT=${KERNELS_OUT:-1}
mkdir -p "$OUT" "$WORK"

# The CUDA libraries' paths and cubecl's settings.
# shellcheck source=scripts/gpu-env.sh
. "$(dirname "$0")/gpu-env.sh"

{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
    echo "preset $PRESET, $BATCH x $SEQ tokens per step, lr $LR, stop at $STOP_AT s"
} >"$OUT/summary.txt"
(nvidia-smi dmon -s um -d 10 >"$OUT/dmon.txt" 2>&1 &)

# name, bottleneck (true/false): one run, in a folder of its own so that each process keeps its
# own kernel cache (cubecl's cache sits in the `target/` beside the nearest Cargo.toml).
run() {
    d="$WORK/$1"
    mkdir -p "$d" && touch "$d/Cargo.toml"
    cat >"$d/run.yaml" <<EOF
model:
  preset: $PRESET
  reembed: false
  bottleneck: $2
train:
  steps: $STEPS
  batch_size: $BATCH
  seq_len: $SEQ
  lr: $LR
  eval_every: $EVAL
  seed: 0
  wire: bf16
data:
  source: $DATA
EOF
    (cd "$d" && RAYON_NUM_THREADS=4 timeout -s TERM -k "$GRACE" "$STOP_AT" "$BIN" train \
        --config run.yaml --device "$DEVICE" --out "$d/ckpt" --quiet \
        --metrics-out "$OUT/$1.metrics.jsonl" --summary-out "$OUT/$1.summary.json" \
        >"$WORK/$1.log" 2>&1)
    echo "== $1: exit $? at $(($(date +%s) - T0)) s" >>"$OUT/summary.txt"
    rm -rf "$d/ckpt"
}
[ -n "$KERNELS_IN" ] && tar xzf "$KERNELS_IN" -C "$WORK"
T0=$(date +%s)
run bottleneck true &
run none false &
wait
for f in "$WORK"/*.log; do
    echo "== $f"
    tail -n 12 "$f"
done >>"$OUT/summary.txt"
if [ "$KERNELS_OUT" = 1 ] && [ -d "$WORK/bottleneck/target" ] && [ -d "$WORK/none/target" ]; then
    # Both runs' caches, each under its run's name, in pieces of 15 MB: each small enough to
    # come back from the GPU machine.
    (cd "$WORK" && tar czf - bottleneck/target none/target) |
        split -b 15000000 -d - "$OUT/kernels.tar.gz."
    ls -l "$OUT" >>"$OUT/summary.txt"
fi
cat "$OUT/summary.txt"
