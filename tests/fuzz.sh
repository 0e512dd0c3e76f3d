#!/usr/bin/env bash
# The fuzz targets of the daemon's wire parsers (crates/ratemeshd/fuzz: the RESP parser, RESP
# round trips through a stream cut in pieces, the HTTP/1.1 front's request heads), each run by
# libFuzzer for a bounded time. Any crash, failed property, timeout or memory overrun fails the
# script; libFuzzer's reproducer is left in crates/ratemeshd/fuzz/artifacts/TARGET/.
#
#   bash tests/fuzz.sh [TARGET...]        (default: every target)
#
# Stable Rust: cargo-fuzz with `--sanitizer none`, which passes rustc no `-Z` flag, so neither
# nightly nor RUSTC_BOOTSTRAP is needed (crates/ratemeshd/fuzz/README.md says what that gives up).
# Installs what it needs: cargo-fuzz (pinned, from crates.io) and, when no C++ compiler is there,
# g++ from Debian (libfuzzer-sys compiles libFuzzer). Fails, never skips.
#
# Settings (environment):
#   FUZZ_SECONDS   each target's run (default 60: libFuzzer's -max_total_time)
#   FUZZ_RSS_MB    libFuzzer's -rss_limit_mb, which also bounds one allocation (default 1024)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."

cargo_fuzz_version=0.13.2
fuzz_seconds=${FUZZ_SECONDS:-60}
rss_mb=${FUZZ_RSS_MB:-1024}
crate=crates/ratemeshd
fuzz=$crate/fuzz
all_targets=(resp resp_roundtrip http_front)
targets=("$@")
((${#targets[@]})) || targets=("${all_targets[@]}")

# --- tools --------------------------------------------------------------------------------------
if [[ $(cargo fuzz --version 2>/dev/null) != "cargo-fuzz $cargo_fuzz_version" ]]; then
    say "installing cargo-fuzz $cargo_fuzz_version from crates.io"
    cargo install cargo-fuzz --locked --version "$cargo_fuzz_version" ||
        fail "cargo install cargo-fuzz $cargo_fuzz_version failed"
fi
if ! command -v c++ >/dev/null; then
    say "no C++ compiler (libfuzzer-sys builds libFuzzer): installing g++ from Debian"
    apt_install g++ || fail "g++ is required and could not be installed"
fi

# --- build --------------------------------------------------------------------------------------
# cargo fuzz has no --locked: the fuzz crate's own Cargo.lock is checked first, so that CI never
# fuzzes a dependency graph other than the committed one.
cargo metadata --locked --format-version 1 --manifest-path "$fuzz/Cargo.toml" >/dev/null ||
    fail "$fuzz/Cargo.lock is not up to date with $fuzz/Cargo.toml"
started=$SECONDS
(cd "$crate" && cargo fuzz build --sanitizer none) || fail "building the fuzz targets failed"
say "fuzz targets built in $((SECONDS - started)) s"

# --- runs ---------------------------------------------------------------------------------------
# The corpus (fuzz/corpus/TARGET, not committed) starts from the committed seeds
# (fuzz/seeds/TARGET); libFuzzer adds what it finds to the first directory only.
for target in "${targets[@]}"; do
    mkdir -p "$fuzz/corpus/$target" "$fuzz/artifacts/$target"
    corpora=("fuzz/corpus/$target")
    [[ -d $fuzz/seeds/$target ]] && corpora+=("fuzz/seeds/$target")
    log=$fuzz/artifacts/$target/run.log
    say "$target: ${fuzz_seconds} s (log: $log)"
    if ! (cd "$crate" && cargo fuzz run --sanitizer none "$target" "${corpora[@]}" -- \
        -max_total_time="$fuzz_seconds" -rss_limit_mb="$rss_mb" -timeout=10 -print_final_stats=1) \
        >"$log" 2>&1; then
        tail -n 60 "$log" >&2
        fail "$target: libFuzzer stopped on a failure (reproducer in $fuzz/artifacts/$target/)"
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    per_s=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    coverage=$(grep -o 'DONE *cov: [0-9]*' "$log" | grep -o '[0-9]*$' || true)
    say "$target: ok, ${runs:-?} runs, ${per_s:-?} per second, coverage ${coverage:-?} edges"
done
