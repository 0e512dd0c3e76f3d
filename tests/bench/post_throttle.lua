-- wrk script for tests/bench.sh's peers mode: throttlecrab-server's POST /throttle, keys drawn
-- at random from BENCH_KEYS keys (default 10000), the same bucket as ratemeshd's "bench" policy
-- (capacity 100, 10 per second).
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
   local body = string.format(
      '{"key":"user-%d","max_burst":99,"count_per_period":10,"period":1}', math.random(keys))
   return wrk.format(nil, nil, nil, body)
end
