-- wrk script for bench/run.sh: POSTs a JSON body, BENCH_BODY, a format string whose one %d is
-- a key number drawn at random from BENCH_KEYS keys (default 10000): the same key spread as the
-- Redis + Lua run, for ratemeshd's /v1/check and the peers' routes alike. Responses are 200
-- whether the check is allowed or not; wrk reports any other status as "Non-2xx or 3xx
-- responses", which bench/run.sh treats as a failed run.
local keys = tonumber(os.getenv("BENCH_KEYS") or "10000")
local body = os.getenv("BENCH_BODY") or error("BENCH_BODY is not set")

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

local counter = 0

function setup(thread)
   counter = counter + 1
   thread:set("seed", counter)
end

function init(args)
   -- Each wrk thread has its own Lua state: give each its own random sequence.
   math.randomseed(os.time() * 1000 + (seed or 0))
end

function request()
   return wrk.format(nil, nil, nil, string.format(body, math.random(keys)))
end
