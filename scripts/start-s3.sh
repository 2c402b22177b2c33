#!/usr/bin/env bash
# Start a local S3-compatible server (s3s-fs) in the background for tests and demos, and wait
# until it accepts connections.
#
# Usage: scripts/start-s3.sh [PORT] [DIR]
#   PORT  port on 127.0.0.1 (default 9014)
#   DIR   directory holding the buckets (default: a new temporary directory)
# Credentials come from S3_ACCESS_KEY / S3_SECRET_KEY (default iota-test / iota-test-secret).
#
# Prints the environment to use it (source-able), and writes the server's PID to DIR/s3s-fs.pid;
# stop it with: kill "$(cat DIR/s3s-fs.pid)".
#
# Install the server once with:
#   cargo install s3s-fs@0.14.1 --features binary --locked
set -euo pipefail

port="${1:-9014}"
dir="${2:-$(mktemp -d -t iota-s3-XXXXXX)}"
access_key="${S3_ACCESS_KEY:-iota-test}"
secret_key="${S3_SECRET_KEY:-iota-test-secret}"

bin="$(command -v s3s-fs || true)"
if [[ -z "$bin" && -x "${CARGO_HOME:-$HOME/.cargo}/bin/s3s-fs" ]]; then
    bin="${CARGO_HOME:-$HOME/.cargo}/bin/s3s-fs"
fi
if [[ -z "$bin" ]]; then
    echo "s3s-fs not found; install it with: cargo install s3s-fs@0.14.1 --features binary --locked" >&2
    exit 1
fi

mkdir -p "$dir"
"$bin" --host 127.0.0.1 --port "$port" --access-key "$access_key" --secret-key "$secret_key" \
    "$dir" >"$dir/s3s-fs.log" 2>&1 &
pid=$!
echo "$pid" >"$dir/s3s-fs.pid"

# Wait up to 20 s for the port to answer (bash's /dev/tcp needs no extra tools).
for _ in $(seq 1 200); do
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "s3s-fs exited early; its log:" >&2
        cat "$dir/s3s-fs.log" >&2
        exit 1
    fi
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "export AWS_ENDPOINT_URL=http://127.0.0.1:$port"
        echo "export AWS_ACCESS_KEY_ID=$access_key"
        echo "export AWS_SECRET_ACCESS_KEY=$secret_key"
        echo "export AWS_REGION=us-east-1"
        echo "# s3s-fs pid $pid, data in $dir"
        exit 0
    fi
    sleep 0.1
done
echo "s3s-fs did not open port $port within 20 s" >&2
kill "$pid" 2>/dev/null || true
exit 1
