#!/usr/bin/env bash
# The example alerting rules (deploy/prometheus), checked offline with Prometheus's own promtool
# (Debian's `prometheus` package ships it). Run by tests/kubernetes.sh, the check of deploy/.
#
#  1. `promtool check rules` on every rules file: YAML, PromQL, templates;
#  2. `promtool test rules` on every *.test.yml beside them: the alerts fire (labels and
#     annotations as written) exactly when their series say so (deploy/prometheus/*.test.yml);
#  3. every ratemesh_* series a rule names is one ratemeshd exports: the name (less a
#     _bucket, _count, _sum or _total suffix) appears in crates/*/src.
#
# Installs promtool when missing (`apt-get install --no-install-recommends prometheus`: the
# package's service is not started in a container); fails, never skips.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."

if ! command -v promtool >/dev/null; then
    say "installing promtool (Debian's prometheus package)"
    apt_install --no-install-recommends prometheus || fail "promtool is required and could not be installed"
fi
require_tools promtool
say "$(promtool --version 2>&1 | head -n 1)"

shopt -s nullglob
tests=(deploy/prometheus/*.test.yml)
rules=()
for file in deploy/prometheus/*.yml deploy/prometheus/*.yaml; do
    [[ $file == *.test.yml ]] || rules+=("$file")
done
((${#rules[@]})) || fail "no rules file in deploy/prometheus"
((${#tests[@]})) || fail "no rule tests (*.test.yml) in deploy/prometheus"

promtool check rules "${rules[@]}" || fail "promtool check rules failed"
for file in "${tests[@]}"; do
    (cd "$(dirname "$file")" && promtool test rules "$(basename "$file")") || fail "promtool test rules $file failed"
done

missing=()
for name in $(grep -hv '^\s*#' "${rules[@]}" | grep -o 'ratemesh_[a-z0-9_]*' | sort -u); do
    base=$name
    for suffix in _bucket _count _sum _total; do base=${base%"$suffix"}; done
    grep -rqw -e "$name" -e "$base" crates/*/src || missing+=("$name")
done
((${#missing[@]} == 0)) || fail "series named in the rules that no crate exports: ${missing[*]}"
say "ok: ${#rules[@]} rules file(s) valid, ${#tests[@]} test file(s) pass, every series named is exported"
