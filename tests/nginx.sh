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
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."

limit=20           # the policy's limit: 20 per day, nothing refills while the test runs
extra=10           # requests beyond the limit
wait_s=60          # the bound of every wait

# --- tools --------------------------------------------------------------------------------------
if ! command -v nginx >/dev/null; then
    say "installing nginx from Debian"
    apt_install nginx-light || apt_install nginx || fail "nginx is required and could not be installed"
fi
command -v nginx >/dev/null || fail "nginx is required and could not be installed"
nginx -V 2>&1 | grep -q -- '--with-http_auth_request_module' || fail "this nginx lacks the auth_request module"
require_tools curl python3
say "$(nginx -v 2>&1)"

ratemeshd_binary

# --- scratch directory, processes, cleanup ------------------------------------------------------
ratemeshd_pid=
nginx_pid=
make_work
# nginx's workers run as an unprivileged user: they must be able to read the site.
chmod 755 "$work"
stop_at_exit nginx_pid ratemeshd_pid
show_at_failure "ratemeshd log" 30 "$work/ratemeshd.log"
show_at_failure "nginx error log" 30 "$work/nginx-error.log"

# Five distinct free loopback ports (ratemeshd's four listeners, nginx).
ratemeshd_ports p_nginx/tcp

# --- ratemeshd ----------------------------------------------------------------------------------
write_config "$work/ratemesh.toml" <<EOF
[[policies]]
name = "nginx-site"
algorithm = "token_bucket"
limit = $limit
period_ms = 86400000
EOF
start_ratemeshd "$work/ratemesh.toml"
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
