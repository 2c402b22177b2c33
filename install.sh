#!/bin/sh
# Installs the `iota` binary.
#
#   curl -sSf <release-url>/install.sh | sh                     # into ~/.local/bin
#   curl -sSf <release-url>/install.sh | sh -s -- --prefix /opt/iota
#   sh install.sh --from-source                                 # build with cargo
#
# It detects the OS and CPU, downloads the matching release archive
# ($IOTA_INSTALL_BASE/$IOTA_VERSION/iota-<target>.tar.gz), checks its SHA-256 against the
# release's SHA256SUMS file, and copies `iota` into PREFIX/bin. A mismatch installs nothing.
# With no release for the platform, or with --from-source, it builds from source with
# `cargo install` (from this checkout when run from one, else from the git URL).
#
# Environment: IOTA_INSTALL_BASE (where releases are published; scripts/release.sh stamps it
# into the install.sh it publishes), IOTA_VERSION (default: latest), IOTA_GIT_URL (for source
# builds outside a checkout).
set -eu

# Stamped by scripts/release.sh into the published copy; empty in the source tree.
DEFAULT_BASE=""
DEFAULT_GIT_URL=""

base="${IOTA_INSTALL_BASE:-$DEFAULT_BASE}"
version="${IOTA_VERSION:-latest}"
git_url="${IOTA_GIT_URL:-$DEFAULT_GIT_URL}"
prefix="${HOME:-}/.local"
from_source=0
features=""
print_target=0

say() { printf 'iota install: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

usage() {
    cat <<'USAGE'
Usage: install.sh [--prefix DIR] [--version V] [--from-source] [--features LIST] [--git URL]

  --prefix DIR      install into DIR/bin (default ~/.local, so ~/.local/bin/iota)
  --version V       release to install (default latest; env IOTA_VERSION)
  --from-source     build with cargo instead of downloading a release
  --features LIST   cargo features for a source build, e.g. cuda or wgpu
  --git URL         repository to build from outside a checkout (env IOTA_GIT_URL)
USAGE
}

while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) [ $# -ge 2 ] || die "--prefix needs a directory"; prefix="$2"; shift 2 ;;
        --prefix=*) prefix="${1#*=}"; shift ;;
        --version) [ $# -ge 2 ] || die "--version needs a value"; version="$2"; shift 2 ;;
        --version=*) version="${1#*=}"; shift ;;
        --from-source) from_source=1; shift ;;
        --features) [ $# -ge 2 ] || die "--features needs a list"; features="$2"; shift 2 ;;
        --features=*) features="${1#*=}"; shift ;;
        --git) [ $# -ge 2 ] || die "--git needs a URL"; git_url="$2"; shift 2 ;;
        --git=*) git_url="${1#*=}"; shift ;;
        --print-target) print_target=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown option $1" ;;
    esac
done
[ -n "$prefix" ] || die "HOME is not set: pass --prefix DIR"
bindir="$prefix/bin"

detect_target() {
    os="$(uname -s)"
    arch="$(uname -m)"
    case "$arch" in
        x86_64|amd64) arch=x86_64 ;;
        aarch64|arm64) arch=aarch64 ;;
        *) echo "unsupported-$arch"; return ;;
    esac
    case "$os" in
        Linux) echo "$arch-unknown-linux-gnu" ;;
        Darwin) echo "$arch-apple-darwin" ;;
        *) echo "unsupported-$os" ;;
    esac
}

# fetch URL FILE: downloads URL into FILE; non-zero on any failure (404 included).
fetch() {
    if command -v curl >/dev/null 2>&1; then
        curl -fsSL --retry 2 -o "$2" "$1"
    elif command -v wget >/dev/null 2>&1; then
        wget -q -O "$2" "$1"
    else
        die "neither curl nor wget is installed"
    fi
}

sha256_of() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -d' ' -f1
    elif command -v shasum >/dev/null 2>&1; then
        shasum -a 256 "$1" | cut -d' ' -f1
    else
        die "neither sha256sum nor shasum is installed: cannot verify the download"
    fi
}

place() {
    mkdir -p "$bindir"
    cp "$1" "$bindir/iota.tmp.$$"
    chmod 755 "$bindir/iota.tmp.$$"
    mv "$bindir/iota.tmp.$$" "$bindir/iota"
}

build_from_source() {
    command -v cargo >/dev/null 2>&1 ||
        die "cargo not found: install Rust (https://rustup.rs), then run this again"
    here=""
    if dir="$(cd "$(dirname "$0")" 2>/dev/null && pwd)"; then
        here="$dir"
    fi
    set -- --locked --root "$prefix"
    if [ -n "$features" ]; then
        set -- "$@" --features "$features"
    fi
    if [ -n "$here" ] && [ -f "$here/Cargo.toml" ] && grep -q '^name = "iota"' "$here/Cargo.toml"; then
        say "building from the checkout in $here (this takes a few minutes)"
        cargo install "$@" --path "$here"
    elif [ -n "$git_url" ]; then
        say "building from $git_url (this takes a few minutes)"
        cargo install "$@" --git "$git_url" iota
    else
        die "no checkout here and no git URL: run this script from an iota checkout, or pass --git URL"
    fi
}

install_release() {
    target="$1"
    [ -n "$base" ] || return 1
    tmp="$(mktemp -d 2>/dev/null || mktemp -d -t iota-install)"
    trap 'rm -rf "$tmp"' EXIT
    archive="iota-$target.tar.gz"
    url="$base/$version/$archive"
    say "downloading $url"
    if ! fetch "$url" "$tmp/$archive"; then
        say "no release archive for $target at $base/$version"
        return 1
    fi
    fetch "$base/$version/SHA256SUMS" "$tmp/SHA256SUMS" ||
        die "the release has no SHA256SUMS file: refusing to install an unverified binary"
    expected="$(awk -v f="$archive" '$2 == f || $2 == "*" f { print $1 }' "$tmp/SHA256SUMS")"
    [ -n "$expected" ] || die "SHA256SUMS lists no checksum for $archive: refusing to install"
    actual="$(sha256_of "$tmp/$archive")"
    if [ "$actual" != "$expected" ]; then
        die "checksum mismatch for $archive (expected $expected, got $actual): the download is corrupt or tampered with; nothing was installed"
    fi
    say "checksum verified ($actual)"
    mkdir "$tmp/x"
    tar -xzf "$tmp/$archive" -C "$tmp/x"
    [ -f "$tmp/x/iota" ] || die "the archive holds no iota binary"
    place "$tmp/x/iota"
    return 0
}

target="$(detect_target)"
if [ "$print_target" = 1 ]; then
    echo "$target"
    exit 0
fi
if [ "$from_source" = 1 ]; then
    build_from_source
elif ! install_release "$target"; then
    if [ -z "$base" ]; then
        say "no release location configured (IOTA_INSTALL_BASE); building from source"
    else
        say "building from source instead"
    fi
    build_from_source
fi

say "installed $("$bindir/iota" --version 2>/dev/null || echo iota) into $bindir"
case ":${PATH:-}:" in
    *":$bindir:"*) say "next: iota setup" ;;
    *)
        say "$bindir is not on your PATH; add it with:"
        say "    export PATH=\"$bindir:\$PATH\"    (and put that line in ~/.profile)"
        ;;
esac
