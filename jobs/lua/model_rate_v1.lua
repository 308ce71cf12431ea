-- model_rate_v1: one request and token budget shared by every worker calling one model.
-- Each bucket holds the next time (ms) it is free (GCRA: a token bucket without a burst), so
-- requests are spread evenly instead of bunching at the start of each minute.
-- KEYS[1] requests bucket (next free slot, ms)  KEYS[2] tokens bucket (tokens paid off at, ms)
-- KEYS[3] paused-until (ms; set when the server answered 429 with Retry-After)
-- ARGV[1] op: 'acquire' | 'spend' | 'pause'
-- ARGV[2] now in ms ('' = Redis TIME, one clock for every worker)
-- ARGV[3] ms per request (60000 / RPM; 0 = no request limit)
-- ARGV[4] ms per token (60000 / TPM; 0 = no token limit)
-- ARGV[5] spend: tokens used; pause: how long, in ms
-- ARGV[6] acquire: the longest wait for a pause (ms) a caller will sit out in place
-- Returns {code, wait_ms}. acquire: {0, w} a request slot is reserved, start after w ms;
-- {1, w} the token budget is spent, ask again after w ms (nothing reserved); {2, w} paused
-- for longer than ARGV[6], nothing reserved. spend, pause: {0, 0}.
local now = tonumber(ARGV[2])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local per_request = tonumber(ARGV[3]) or 0
local per_token = tonumber(ARGV[4]) or 0
local amount = tonumber(ARGV[5]) or 0

-- A bucket key lives a minute past the time it stops mattering.
local function store(key, until_ms)
  redis.call('SET', key, string.format('%d', math.ceil(until_ms)), 'PX', math.max(1, math.ceil(until_ms - now)) + 60000)
end
local function read(key)
  return tonumber(redis.call('GET', key) or '0') or 0
end

if ARGV[1] == 'pause' then
  if now + amount > read(KEYS[3]) then
    store(KEYS[3], now + amount)
  end
  return {0, 0}
end

if ARGV[1] == 'spend' then
  if per_token > 0 and amount > 0 then
    store(KEYS[2], math.max(read(KEYS[2]), now) + amount * per_token)
  end
  return {0, 0}
end

-- acquire
local paused = read(KEYS[3])
if paused - now > (tonumber(ARGV[6]) or 0) then
  return {2, math.ceil(paused - now)}
end
local tokens_free_at = read(KEYS[2])
if per_token > 0 and tokens_free_at > now then
  return {1, math.ceil(tokens_free_at - now)}
end
local start = math.max(read(KEYS[1]), now, paused)
if per_request > 0 then
  store(KEYS[1], start + per_request)
end
return {0, math.ceil(start - now)}
