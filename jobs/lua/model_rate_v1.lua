-- KEYS: requests tokens paused
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
local now = now_ms(ARGV[2])
local per_request = tonumber(ARGV[3]) or 0
local per_token = tonumber(ARGV[4]) or 0
local amount = tonumber(ARGV[5]) or 0

if ARGV[1] == 'pause' then
  if now + amount > bucket_read(KEYS[3]) then
    bucket_store(KEYS[3], now + amount, now)
  end
  return {0, 0}
end

if ARGV[1] == 'spend' then
  if per_token > 0 and amount > 0 then
    bucket_store(KEYS[2], math.max(bucket_read(KEYS[2]), now) + amount * per_token, now)
  end
  return {0, 0}
end

return rate_acquire(KEYS[1], KEYS[2], KEYS[3], now, per_request, per_token, tonumber(ARGV[6]) or 0)
