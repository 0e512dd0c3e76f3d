-- wrk script for tests/bench.sh: POST /v1/check against one policy ("bench"), each request for a
-- key drawn at random from BENCH_KEYS keys (default 10000), the same key spread as the Redis +
-- Lua run. Responses are 200 whether the check is allowed or not; wrk reports any other status
-- as "Non-2xx or 3xx responses", which bench.sh treats as a failed run.
local keys = tonumber(os.getenv("BENCH_KEYS") or "10000")

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
   local body = string.format('{"key":"user-%d","policy":"bench"}', math.random(keys))
   return wrk.format(nil, nil, nil, body)
end
