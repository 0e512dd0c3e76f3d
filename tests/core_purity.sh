#!/usr/bin/env bash
# Architecture invariant check: ratemesh-core does no IO. It must not depend on an async runtime,
# a network stack, gossip, or a clock/OS-randomness crate, and its sources must not read a clock,
# spawn threads, touch sockets or the file system.
set -euo pipefail
cd "$(dirname "$0")/.."

status=0
forbidden_crates='^(tokio|async-std|smol|mio|quinn|quinn-proto|rustls|chitchat|getrandom|chrono|time|quanta|coarsetime|socket2|libc)( |$)'
deps=$(cargo tree --locked -p ratemesh-core -e normal --prefix none --format '{p}' | sort -u)
if bad=$(grep -E "$forbidden_crates" <<<"$deps"); then
  echo "core-purity: ratemesh-core depends on forbidden crates:"; echo "$bad"; status=1
fi
forbidden_code='std::time::(Instant|SystemTime)|SystemTime::now|Instant::now|std::thread|std::net|std::fs|tokio|thread_rng|rand::rng\(|OsRng|from_os_rng|RandomState|HashMap::new|HashSet::new'
# Comments may name what the core does not do; code may not.
if bad=$(grep -rnE "$forbidden_code" crates/ratemesh-core/src | grep -vE '^[^:]+:[0-9]+:[[:space:]]*//'); then
  echo "core-purity: ratemesh-core sources do IO:"; echo "$bad"; status=1
fi
if [ "$status" -eq 0 ]; then
  echo "core-purity: ok ($(wc -l <<<"$deps") crates in ratemesh-core's normal dependency tree, none forbidden)"
fi
exit "$status"
