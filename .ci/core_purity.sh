#!/usr/bin/env bash
# Architecture invariant check: ratemesh-core does no IO.
# - Its code: the crate is `#![no_std]` (alloc only), so the compiler refuses any clock, thread,
#   socket, file or OS randomness API; this builds it without its `std` feature, where nothing in
#   its dependency graph links `std` either (the ring, over hashring, and the node need `std`).
# - Its dependencies: no async runtime, network stack, gossip, clock or OS-randomness crate, with
#   the default features too.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo clippy --locked -p ratemesh-core --no-default-features -- -D warnings
# Only the host target is installed here, so the build alone would not notice a dependency that
# links std: every library in that graph (proc macros run on the host) must declare no_std.
registry="${CARGO_HOME:-$HOME/.cargo}/registry/src"
nostd_graph=$(cargo tree --locked -p ratemesh-core --no-default-features -e normal,no-proc-macro --prefix none \
  --format '{p}' | grep -v '^ratemesh-core ' | awk '{print $1 "-" substr($2, 2)}' | sort -u)
for package in $nostd_graph; do
  lib=$(ls -d "$registry"/*/"$package"/src/lib.rs 2>/dev/null | head -1)
  if [ -z "$lib" ] || ! grep -qE '^#!\[(cfg_attr\(.*)?no_std' "$lib"; then
    echo "core-purity: $package (in the no_std build of ratemesh-core) does not declare no_std"; exit 1
  fi
done
echo "core-purity: ratemesh-core builds as no_std + alloc without its std feature ($(wc -w <<<"$nostd_graph") dependencies, each no_std)"

forbidden_crates='^(tokio|async-std|smol|mio|quinn|quinn-proto|rustls|chitchat|getrandom|chrono|time|quanta|coarsetime|socket2|libc)( |$)'
deps=$(cargo tree --locked -p ratemesh-core -e normal --prefix none --format '{p}' | sort -u)
if bad=$(grep -E "$forbidden_crates" <<<"$deps"); then
  echo "core-purity: ratemesh-core depends on forbidden crates:"; echo "$bad"; exit 1
fi
echo "core-purity: ok ($(wc -l <<<"$deps") crates in ratemesh-core's normal dependency tree, none forbidden)"
