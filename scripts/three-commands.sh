#!/bin/sh
# Times the README's "Mining in three commands" from nothing, on this machine, over loopback:
#
#   1. curl -sSf BASE/install.sh | sh      (download, SHA-256 check, unpack into ~/.local/bin)
#   2. iota setup --yes --orchestrator URL (new hotkey, live check, ~/.config/iota/miner.yaml)
#   3. iota mine                           (until the orchestrator has accepted its first backward)
#
# Each runs with a fresh, empty HOME and PATH=$HOME/.local/bin:/usr/bin:/bin (no Rust, no iota).
# The release is made by scripts/release.sh from BINARY and served by `python3 -m http.server`;
# the run is an `iota orchestrate` of the tiny preset (3 sections) with two miners already
# mining, so the new one completes the pipeline.
#
# Usage: scripts/three-commands.sh [--binary PATH]   (default target/debug/iota)
# Needs: curl, python3, sha256sum.
set -eu

cd "$(dirname "$0")/.."
binary=target/debug/iota
while [ $# -gt 0 ]; do
    case "$1" in
        --binary) binary="$2"; shift 2 ;;
        *) echo "three-commands.sh: unknown option $1" >&2; exit 1 ;;
    esac
done
[ -x "$binary" ] || { echo "three-commands.sh: $binary is not an executable (cargo build first)" >&2; exit 1; }
binary="$(cd "$(dirname "$binary")" && pwd)/$(basename "$binary")"

work="$(mktemp -d)"
pids=""
cleanup() {
    for pid in $pids; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

now() { date +%s.%N; }
elapsed() { awk -v end="$1" -v start="$2" 'BEGIN { printf "%.2f", end - start }'; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() {
    tries=0
    until curl -sf "$1" >/dev/null 2>&1; do
        tries=$((tries + 1))
        [ "$tries" -lt 600 ] || { echo "three-commands.sh: $1 never answered" >&2; exit 1; }
        sleep 0.05
    done
}
# Backwards the orchestrator accepted from hotkey $2 (0 when it does not list it yet).
backwards_of() {
    curl -sf "$1/api/status" | tr '{' '\n' | grep "\"hotkey\":\"$2\"" \
        | sed 's/.*"backwards":\([0-9]*\).*/\1/' | head -n 1
}

# The release, served over HTTP.
http_port="$(free_port)"
base="http://127.0.0.1:$http_port"
sh scripts/release.sh --base "$base" --binary "$binary" --out "$work/dist" >/dev/null
python3 -m http.server "$http_port" --bind 127.0.0.1 --directory "$work/dist" >/dev/null 2>&1 &
pids="$pids $!"
wait_http "$base/install.sh"

# The run: an orchestrator of the tiny preset and two miners already there.
orch_port="$(free_port)"
orch="127.0.0.1:$orch_port"
cat >"$work/run.yaml" <<EOF
run: three-commands
model: {preset: tiny}
listen: $orch
data_dir: $work/state
batch_size: 2
seq_len: 16
heartbeat_s: 1
EOF
"$binary" orchestrate --config "$work/run.yaml" >"$work/orchestrator.log" 2>&1 &
pids="$pids $!"
wait_http "http://$orch/health"
for n in 1 2; do
    home="$work/miner$n"
    mkdir -p "$home"
    HOME="$home" "$binary" setup --yes --orchestrator "$orch" >/dev/null
    HOME="$home" "$binary" mine >"$work/miner$n.log" 2>&1 &
    pids="$pids $!"
done

# From nothing: an empty HOME, no iota and no cargo on PATH.
home="$work/newcomer"
mkdir -p "$home"
fresh() { env -i HOME="$home" PATH="$home/.local/bin:/usr/bin:/bin" sh -c "$1"; }

t0="$(now)"
fresh "curl -sSf $base/install.sh | sh" >"$work/install.log" 2>&1
t1="$(now)"
fresh "iota setup --yes --orchestrator $orch" >"$work/setup.log" 2>&1
t2="$(now)"
address="$(fresh "iota wallet show")"
fresh "exec iota mine" >"$work/mine.log" 2>&1 &
pids="$pids $!"
tries=0
until [ "$(backwards_of "http://$orch" "$address")" -ge 1 ] 2>/dev/null; do
    tries=$((tries + 1))
    [ "$tries" -lt 6000 ] || { echo "three-commands.sh: no accepted backward in 300 s" >&2; cat "$work/mine.log" >&2; exit 1; }
    sleep 0.05
done
t3="$(now)"

echo "| step | command | seconds |"
echo "|---|---|---|"
echo "| 1 | curl -sSf $base/install.sh \\| sh | $(elapsed "$t1" "$t0") |"
echo "| 2 | iota setup --yes --orchestrator $orch | $(elapsed "$t2" "$t1") |"
echo "| 3 | iota mine (to its first accepted backward) | $(elapsed "$t3" "$t2") |"
echo "| | from nothing to mining | $(elapsed "$t3" "$t0") |"
echo "binary: $binary ($(du -h "$binary" | cut -f1)); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
