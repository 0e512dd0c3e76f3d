#!/usr/bin/env bash
# nginx (Debian's package, a client this project did not write) in front of a static site, with
# `auth_request` to ratemeshd's GET /v1/auth: requests beyond the limit get 429 from nginx, with
# ratemeshd's Retry-After. Run by .ci/run.
#
# nginx's auth_request only knows 2xx (allow), 401 and 403 (deny with that code); any other code
# from the subrequest, 429 included, becomes a 500. The configuration below therefore sends 500s
# to a named location that looks at the subrequest's real status (auth_request_set ...
# $upstream_status): 429 → 429 with Retry-After and X-RateLimit-* copied from ratemeshd; anything
# else (ratemeshd down: 502) stays a 500, so an outage is never disguised as "too many requests".
# The script checks both: N requests pass, the next ones get 429, and with ratemeshd stopped nginx
# answers 500.
#
# Installs nginx-light (or nginx) from Debian when missing; fails, never skips, when it cannot.
set -euo pipefail
cd "$(dirname "$0")/.."

limit=20           # the policy's limit: 20 per day, nothing refills while the test runs
extra=10           # requests beyond the limit
wait_s=60          # the bound of every wait

fail() { echo "nginx.sh: FAIL: $*" >&2; exit 1; }
say() { printf 'nginx.sh: %s\n' "$*"; }

# --- tools --------------------------------------------------------------------------------------
if ! command -v nginx >/dev/null; then
    say "installing nginx from Debian"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light ||
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx
fi
command -v nginx >/dev/null || fail "nginx is required and could not be installed"
nginx -V 2>&1 | grep -q -- '--with-http_auth_request_module' || fail "this nginx lacks the auth_request module"
for tool in curl python3; do
    command -v "$tool" >/dev/null || fail "$tool is required and missing"
done
say "$(nginx -v 2>&1)"

binary=$(bash tests/docker/static-binary.sh | tail -n 1)

# --- scratch directory, processes, cleanup ------------------------------------------------------
work=$(mktemp -d)
# nginx's workers run as an unprivileged user: they must be able to read the site.
chmod 755 "$work"
ratemeshd_pid=
nginx_pid=
cleanup() {
    local status=$?
    if [[ -n $nginx_pid ]]; then kill "$nginx_pid" 2>/dev/null || true; wait "$nginx_pid" 2>/dev/null || true; fi
    if [[ -n $ratemeshd_pid ]]; then kill "$ratemeshd_pid" 2>/dev/null || true; wait "$ratemeshd_pid" 2>/dev/null || true; fi
    if [[ $status -ne 0 ]]; then
        echo "--- ratemeshd log ---" >&2; tail -n 30 "$work/ratemeshd.log" >&2 2>/dev/null || true
        echo "--- nginx error log ---" >&2; tail -n 30 "$work/nginx-error.log" >&2 2>/dev/null || true
    fi
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT

# Five distinct free loopback ports (ratemeshd's four listeners, nginx).
read -r p_http p_grpc p_gossip p_quic p_nginx < <(python3 - <<'EOF'
import socket
ports, held = [], []
while len(ports) < 5:
    kind = socket.SOCK_DGRAM if len(ports) in (2, 3) else socket.SOCK_STREAM
    s = socket.socket(socket.AF_INET, kind)
    s.bind(("127.0.0.1", 0))
    held.append(s)
    if s.getsockname()[1] not in ports:
        ports.append(s.getsockname()[1])
print(*ports)
EOF
)

# wait_for WHAT COMMAND...: polls COMMAND until it succeeds, at most $wait_s seconds.
wait_for() {
    local what=$1 deadline=$((SECONDS + wait_s))
    shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || fail "not within ${wait_s}s: $what"
        [[ -z $ratemeshd_pid ]] || kill -0 "$ratemeshd_pid" 2>/dev/null || fail "ratemeshd exited"
        sleep 0.1 # the poll interval of a bounded poll, not a synchronization
    done
}
answers() { [[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$1") == "$2" ]]; }

# --- ratemeshd ----------------------------------------------------------------------------------
cat >"$work/ratemesh.toml" <<EOF
[listen]
http = "127.0.0.1:$p_http"
grpc = "127.0.0.1:$p_grpc"
gossip = "127.0.0.1:$p_gossip"
quic = "127.0.0.1:$p_quic"

[[policies]]
name = "nginx-site"
algorithm = "token_bucket"
limit = $limit
period_ms = 86400000
EOF
# No RATEMESH_ variable of the caller's environment may leak in.
env -i PATH="$PATH" "$binary" serve --config "$work/ratemesh.toml" >"$work/ratemeshd.log" 2>&1 &
ratemeshd_pid=$!
wait_for "ratemeshd ready on 127.0.0.1:$p_http" answers "http://127.0.0.1:$p_http/readyz" 200
say "ratemeshd ready on 127.0.0.1:$p_http"

# --- nginx --------------------------------------------------------------------------------------
mkdir -p "$work/www" "$work/tmp"
echo "static page" >"$work/www/index.html"
chmod -R a+rX "$work/www"
cat >"$work/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $work/nginx.pid;
error_log $work/nginx-error.log warn;
events { worker_connections 64; }
http {
    access_log $work/nginx-access.log;
    client_body_temp_path $work/tmp/body;
    proxy_temp_path $work/tmp/proxy;
    fastcgi_temp_path $work/tmp/fastcgi;
    uwsgi_temp_path $work/tmp/uwsgi;
    scgi_temp_path $work/tmp/scgi;

    server {
        listen 127.0.0.1:$p_nginx;
        root $work/www;

        # The static site, one rate limit per client address.
        location / {
            auth_request /_ratemesh;
            auth_request_set \$ratemesh_status \$upstream_status;
            auth_request_set \$ratemesh_retry_after \$upstream_http_retry_after;
            auth_request_set \$ratemesh_limit \$upstream_http_x_ratelimit_limit;
            auth_request_set \$ratemesh_remaining \$upstream_http_x_ratelimit_remaining;
            add_header X-RateLimit-Limit \$ratemesh_limit;
            add_header X-RateLimit-Remaining \$ratemesh_remaining;
            # auth_request turns every status but 2xx/401/403 into 500.
            error_page 500 = @ratemesh_refused;
            # Served here, without an internal redirect: the index module (GET / to /index.html)
            # would run the access phase, and so auth_request, again: two hits per request.
            try_files /index.html =404;
        }

        location = /_ratemesh {
            internal;
            proxy_pass http://127.0.0.1:$p_http/v1/auth?policy=nginx-site&key=\$remote_addr;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_set_header X-Original-URI \$request_uri;
        }

        # 429 from ratemeshd: 429 with its headers. Anything else (ratemeshd unreachable: 502)
        # stays an error.
        location @ratemesh_refused {
            add_header Retry-After \$ratemesh_retry_after always;
            add_header X-RateLimit-Limit \$ratemesh_limit always;
            add_header X-RateLimit-Remaining \$ratemesh_remaining always;
            if (\$ratemesh_status = 429) {
                return 429;
            }
            return 500;
        }
    }
}
EOF
nginx -t -q -c "$work/nginx.conf" -p "$work" || fail "nginx refuses the configuration"
nginx -c "$work/nginx.conf" -p "$work" &
nginx_pid=$!
wait_for "nginx listening on 127.0.0.1:$p_nginx" curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$p_nginx/healthz-probe-does-not-exist"
say "nginx on 127.0.0.1:$p_nginx, auth_request to /v1/auth?policy=nginx-site"

# The probe above went through auth_request too and used one of the $limit: ask ratemeshd how
# many remain (cost 0 is a query) rather than assume.
remaining=$(curl -s --max-time 5 -X POST -H 'content-type: application/json' \
    --data '{"key": "127.0.0.1", "policy": "nginx-site", "cost": 0}' "http://127.0.0.1:$p_http/v1/check" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["remaining"])')
say "$remaining of $limit remain for 127.0.0.1"
((remaining > 0 && remaining <= limit)) || fail "unexpected remaining $remaining"

# --- the real client's view ---------------------------------------------------------------------
total=$((remaining + extra))
ok=0 limited=0
# header FILE NAME: a response header's value (case-insensitive name).
header() { tr -d '\r' <"$1" | awk -F': *' -v name="$2" 'tolower($1) == name { print $2 }'; }
for ((i = 1; i <= total; i++)); do
    headers=$work/headers.$i
    status=$(curl -s -D "$headers" -o "$work/body.$i" -w '%{http_code}' --max-time 5 "http://127.0.0.1:$p_nginx/")
    limit_header=$(header "$headers" x-ratelimit-limit)
    remaining_header=$(header "$headers" x-ratelimit-remaining)
    if ((i <= remaining)); then
        [[ $status == 200 ]] || fail "request $i of $total: $status, expected 200 ($(head -c 200 "$work/body.$i"))"
        grep -qx 'static page' "$work/body.$i" || fail "request $i: not the static page"
        # ratemeshd's headers, passed on by nginx.
        [[ $limit_header == "$limit" && $remaining_header == $((remaining - i)) ]] ||
            fail "request $i: X-RateLimit-Limit '$limit_header', X-RateLimit-Remaining '$remaining_header', expected $limit and $((remaining - i))"
        ok=$((ok + 1))
    else
        [[ $status == 429 ]] || fail "request $i of $total: $status, expected 429 ($(head -c 200 "$work/body.$i"))"
        retry_after=$(header "$headers" retry-after)
        [[ $retry_after =~ ^[0-9]+$ ]] && ((retry_after > 0)) ||
            fail "request $i: 429 without a positive integer Retry-After (got '$retry_after'): $(tr -d '\r' <"$headers")"
        [[ $limit_header == "$limit" && $remaining_header == 0 ]] ||
            fail "request $i: X-RateLimit-Limit '$limit_header', X-RateLimit-Remaining '$remaining_header' on the 429"
        limited=$((limited + 1))
    fi
done
say "ok: $ok × 200 then $limited × 429 through nginx (Retry-After: ${retry_after}s, X-RateLimit-* passed on)"
((ok == remaining && limited == extra)) || fail "counts"

# --- ratemeshd gone: nginx must not pretend the client is over its limit ------------------------
kill "$ratemeshd_pid"
wait "$ratemeshd_pid" 2>/dev/null || true
ratemeshd_pid=
status=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$p_nginx/")
[[ $status == 500 ]] || fail "with ratemeshd stopped nginx answered $status, expected 500"
say "ok: ratemeshd stopped → nginx answers 500, not 429"
say "PASS"
