-- wrk script for tests/bench.sh's peers mode: rateguard-sidecar's POST /v1/check, keys drawn at
-- random from BENCH_KEYS keys (default 10000), in its default class.
local keys = tonumber(os.getenv("BENCH_KEYS") or "10000")

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

local counter = 0

function setup(thread)
   counter = counter + 1
   thread:set("seed", counter)
end

function init(args)
   math.randomseed(os.time() * 1000 + (seed or 0))
end

function request()
   return wrk.format(nil, nil, nil, string.format('{"key":"user-%d"}', math.random(keys)))
end
