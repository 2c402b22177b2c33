#!/usr/bin/env bash
# The whole test suite from a fresh machine: installs what the tests need (the S3-compatible
# server they start themselves), checks formatting and lints, checks that the CUDA backend
# compiles (no GPU needed), and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

if ! command -v s3s-fs >/dev/null 2>&1; then
  echo "== installing s3s-fs (the S3-compatible server the storage tests start)"
  CARGO_TARGET_DIR="${TMPDIR:-/tmp}/iota-s3s-target" \
    cargo install s3s-fs@0.14.1 --features binary --locked
fi

# System tools the tests drive: tmux (a real terminal for `iota setup`), shellcheck (install.sh),
# chromium (the dashboard in a real headless browser). Installed from Debian when missing.
missing=()
for tool in tmux shellcheck chromium; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if ((${#missing[@]})); then
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing ${missing[*]} (Debian packages the tests use)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    echo "== cannot install ${missing[*]} (needs root and apt-get); tests that need them say so"
  fi
fi

echo "== cargo fmt --check"
cargo fmt --check
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings
echo "== cargo check --features cuda (the CUDA backend and its GPU smoke test compile)"
cargo check --lib --features cuda
cargo check --features cuda --test cuda_smoke
echo "== cargo test"
cargo test --all-targets
