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

# System tools the tests drive: tmux (a real terminal for `iota setup`), shellcheck and curl
# (install.sh), chromium (the dashboard in a real headless browser). Installed from Debian when
# missing, as root or through passwordless sudo.
missing=()
for tool in tmux shellcheck curl chromium; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if ((${#missing[@]})); then
  as_root=()
  [[ "$(id -u)" == 0 ]] || as_root=(sudo -n)
  if command -v apt-get >/dev/null 2>&1 && "${as_root[@]}" true 2>/dev/null; then
    echo "== installing ${missing[*]} (Debian packages the tests use)"
    if ! { "${as_root[@]}" apt-get update -qq &&
      "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${missing[@]}"; }; then
      echo "== APT-GET FAILED for ${missing[*]}; tests that need them say so"
    fi
  else
    echo "== CANNOT INSTALL ${missing[*]} (needs apt-get and root or passwordless sudo)"
  fi
fi
# Where chromium is (now) installed the browser test must run: it fails rather than skips.
if command -v chromium >/dev/null 2>&1; then
  export IOTA_REQUIRE_BROWSER=1
else
  echo "== NO CHROMIUM: the dashboard browser test will be SKIPPED (apt-get install chromium)"
fi

echo "== cargo fmt --check"
cargo fmt --check
echo "== cargo clippy --all-targets -- -D warnings (the release feature set, then with the test adversaries)"
cargo clippy --all-targets -- -D warnings
cargo clippy --all-targets --features adversary -- -D warnings
echo "== cargo check --features cuda (the CUDA backend and its GPU smoke test compile)"
cargo check --lib --features cuda
cargo check --features cuda --test cuda_smoke
# The hostile miners (`iota mine --adversary`) are built only with the `adversary` feature,
# which the release build leaves out; the tests run the binary with it so they can start them.
echo "== cargo test --features adversary"
cargo test --all-targets --features adversary --no-fail-fast
