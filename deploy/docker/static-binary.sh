#!/usr/bin/env bash
# Builds ratemeshd as a statically linked release binary and prints its path (last line).
#
#   RUSTFLAGS='-C target-feature=+crt-static' \
#       cargo build --release --target x86_64-unknown-linux-gnu -p ratemeshd
#
# into its own target directory (STATIC_TARGET_DIR, default target/static), so that it neither
# invalidates nor is invalidated by the ordinary builds. The container image needs a static binary
# (FROM scratch: no loader, no libc); the other real-client scripts (tests/nginx.sh,
# tests/metrics.sh) run the same binary on the host, which saves CI a second release build.
# Fails unless `file` calls the result static and `ldd` lists no shared library.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

target_dir=${STATIC_TARGET_DIR:-$root/target/static}
triple=x86_64-unknown-linux-gnu

need() {
    command -v "$1" >/dev/null && return
    echo "static-binary: installing $2 for $1" >&2
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >&2
    command -v "$1" >/dev/null || { echo "static-binary: $1 is required and missing" >&2; exit 1; }
}
command -v cargo >/dev/null || { echo "static-binary: cargo is required and missing" >&2; exit 1; }
need file file
need ldd libc-bin

echo "static-binary: release build with crt-static into $target_dir" >&2
RUSTFLAGS='-C target-feature=+crt-static' CARGO_TARGET_DIR="$target_dir" \
    cargo build --release --locked --target "$triple" -p ratemeshd >&2
binary=$target_dir/$triple/release/ratemeshd

# Anything but a static executable fails in a scratch image at its first exec, with a baffling
# "no such file or directory" (the missing file being the dynamic loader).
description=$(file -b "$binary")
case $description in
    *"statically linked"* | *"static-pie linked"*) ;;
    *) echo "static-binary: $binary is not static: $description" >&2; exit 1 ;;
esac
ldd_says=$(ldd "$binary" 2>&1 || true)
case $ldd_says in
    *"not a dynamic executable"* | *"statically linked"*) ;;
    *) echo "static-binary: ldd lists shared libraries for $binary:" >&2; echo "$ldd_says" >&2; exit 1 ;;
esac
echo "static-binary: $description" >&2
echo "$binary"
