-- rate_limit.lua: the token bucket of the seed article "Rate Limiting and Backpressure: Token
-- Bucket vs Leaky Bucket, Distributed Rate Limiters with Redis" (shared/seeds), verbatim: the
-- "standard token bucket Lua implementation" that ratemeshd is compared against in bench/run.sh.
-- KEYS[1] = bucket key, ARGV = capacity, refill_rate, requested_tokens, now_seconds
local capacity = tonumber(ARGV[1])
local refill_rate = tonumber(ARGV[2])
local requested = tonumber(ARGV[3])
local now = tonumber(ARGV[4])

local bucket = redis.call("HMGET", KEYS[1], "tokens", "updated_at")
local tokens = tonumber(bucket[1]) or capacity
local updated_at = tonumber(bucket[2]) or now

local elapsed = math.max(0, now - updated_at)
tokens = math.min(capacity, tokens + elapsed * refill_rate)

local allowed = 0
if tokens >= requested then
    tokens = tokens - requested
    allowed = 1
end

redis.call("HMSET", KEYS[1], "tokens", tokens, "updated_at", now)
redis.call("EXPIRE", KEYS[1], math.ceil(capacity / refill_rate) * 2)

return {allowed, math.floor(tokens)}
