# Helpers shared by bench/run.sh and bench/cluster.sh (sourced after tests/lib.sh, whose
# `fail` they use; run from the repository root). Sourced, never run.

# shellcheck shell=bash disable=SC2034 # clock_ticks_per_s is for the sourcing script
clock_ticks_per_s=$(getconf CLK_TCK)

# cpu_ticks PID: the process's user and system CPU time so far, in clock ticks, as "USER SYSTEM"
# (fields 14 and 15 of /proc/PID/stat, counted after the command name, which may hold spaces).
cpu_ticks() {
    awk '{ sub(/^.*\) /, ""); print $12, $13 }' "/proc/$1/stat" || fail "cannot read /proc/$1/stat"
}

# wrk's "1.23ms" / "456.78us" / "1.02s" → milliseconds.
to_ms() {
    python3 -c '
import re, sys
value, unit = re.fullmatch(r"([0-9.]+)(us|ms|s|m)", sys.argv[1]).groups()
print(float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[unit])' "$1"
}

# wrk_row LOG WHAT: the output of a `wrk --latency` run, LOG, as
# requests_per_second<TAB>p50_ms<TAB>p99_ms<TAB>requests. Fails when any response was not 2xx
# (wrk's "Non-2xx or 3xx responses" line; WHAT names the server in the message) or when the
# numbers are not there.
wrk_row() {
    local log=$1 what=$2 rps p50 p99 requests
    ! grep -q 'Non-2xx' "$log" || fail "$what answered errors: $(grep -E 'Non-2xx|Socket errors' "$log")"
    rps=$(awk '/^Requests\/sec:/ { print $2 }' "$log")
    p50=$(awk '$1 == "50%" { print $2 }' "$log")
    p99=$(awk '$1 == "99%" { print $2 }' "$log")
    requests=$(awk '/requests in/ { print $1 }' "$log")
    [[ -n $rps && -n $p50 && -n $p99 && -n $requests ]] || fail "cannot read wrk's output: $(cat "$log")"
    printf '%s\t%s\t%s\t%s\n' "$rps" "$(to_ms "$p50")" "$(to_ms "$p99")" "$requests"
}
