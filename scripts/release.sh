#!/bin/sh
# Builds a release of iota for this machine's platform into a directory that install.sh can
# install from once it is served over HTTP(S):
#
#   OUT/VERSION/iota-<target>.tar.gz   the binary (plus README.md)
#   OUT/VERSION/SHA256SUMS             sha256sum lines for every archive in OUT/VERSION
#   OUT/install.sh                     install.sh with BASE stamped in as its default
#
# Usage: scripts/release.sh --base URL [--out DIR] [--version V] [--binary PATH]
#   --base URL     where OUT will be served (install.sh downloads from URL/VERSION/...)
#   --out DIR      output directory (default dist)
#   --version V    version directory (default latest)
#   --binary PATH  package this binary instead of running `cargo build --release`
set -eu

cd "$(dirname "$0")/.."
out=dist
version=latest
base=""
binary=""
while [ $# -gt 0 ]; do
    case "$1" in
        --base) base="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --version) version="$2"; shift 2 ;;
        --binary) binary="$2"; shift 2 ;;
        *) echo "release.sh: unknown option $1" >&2; exit 1 ;;
    esac
done
[ -n "$base" ] || { echo "release.sh: --base URL is required" >&2; exit 1; }

if [ -z "$binary" ]; then
    cargo build --release --locked
    binary=target/release/iota
fi
[ -x "$binary" ] || { echo "release.sh: $binary is not an executable" >&2; exit 1; }

# The target triple install.sh will ask for on this machine.
target="$(sh install.sh --print-target)"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
cp "$binary" "$stage/iota"
cp README.md "$stage/"
mkdir -p "$out/$version"
tar -czf "$out/$version/iota-$target.tar.gz" -C "$stage" iota README.md
(cd "$out/$version" && sha256sum iota-*.tar.gz >SHA256SUMS)
sed "s|^DEFAULT_BASE=\"\"|DEFAULT_BASE=\"$base\"|" install.sh >"$out/install.sh"
echo "release.sh: $out/$version/iota-$target.tar.gz, SHA256SUMS and $out/install.sh (base $base)"
