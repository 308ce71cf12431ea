-- model_admit_v1: may this job send its next model call? One round trip that takes the
-- call's turn on the model's shared rate limit (as model_rate_v1 'acquire'), checks that the
-- attempt still holds its lease (a zombie spends nothing), and reserves the call's worst case
-- (prompt estimate + max_tokens) against the job's budget and the owner's daily budget, so
-- calls in flight at once cannot all slip under a line. The item write that stores the
-- answer settles the reservation with the real usage (add_usage in _lib.lua).
-- KEYS[1] requests bucket  KEYS[2] tokens bucket  KEYS[3] paused-until (see model_rate_v1)
-- KEYS[4] job hash  KEYS[5] owner's usage for the UTC day
-- ARGV[1] now in ms ('' = Redis TIME)  ARGV[2] ms per request  ARGV[3] ms per token
-- ARGV[4] longest pause (ms) sat out in place  ARGV[5] attempt token
-- ARGV[6] worst-case tokens  ARGV[7] worst-case cost in nano-USD ('' = no price known)
-- ARGV[8] UTC day  ARGV[9] owner's daily tokens (0 = none)  ARGV[10] owner's daily nano-USD
-- (0 = none)  ARGV[11] owner day ttl
-- Returns {0, w} admitted, start after w ms; {1, w} / {2, w} as rate_acquire (nothing
-- reserved); {3} the lease is lost; {4, what, used, reserved, limit} over a budget, what is
-- 'job_tokens' | 'job_usd' | 'owner_tokens' | 'owner_usd' | 'job_usd_unpriced'.
local now = now_ms(ARGV[1])
local turn = rate_acquire(KEYS[1], KEYS[2], KEYS[3], now, tonumber(ARGV[2]) or 0, tonumber(ARGV[3]) or 0,
  tonumber(ARGV[4]) or 0)
if turn[1] ~= 0 then return turn end
local job = redis.call('HMGET', KEYS[4], 'state', 'token', 'budget_tokens', 'budget_nusd', 'usage_input_tokens',
  'usage_output_tokens', 'usage_cost_nusd', 'reserved_tokens', 'reserved_nusd', 'reserved_by', 'reserved_day')
if job[1] ~= 'running' or job[2] ~= ARGV[5] then return {3} end
local token, day = ARGV[5], ARGV[8]
local worst_tokens = tonumber(ARGV[6]) or 0
local worst_nusd = tonumber(ARGV[7])
-- A reservation left by an earlier attempt (its worker died between a call and its write)
-- is dropped: that attempt will never settle it.
local reserved_tokens, reserved_nusd = tonumber(job[8]) or 0, tonumber(job[9]) or 0
if job[10] ~= token then
  if job[10] and job[11] == day then
    for _, f in ipairs({{'reserved_tokens', reserved_tokens}, {'reserved_nusd', reserved_nusd}}) do
      if f[2] > 0 and redis.call('HINCRBY', KEYS[5], f[1], -f[2]) < 0 then redis.call('HSET', KEYS[5], f[1], 0) end
    end
  end
  reserved_tokens, reserved_nusd = 0, 0
  redis.call('HSET', KEYS[4], 'reserved_tokens', 0, 'reserved_nusd', 0, 'reserved_by', token, 'reserved_day', day)
elseif job[11] ~= day then
  -- A new UTC day: the owner's reservations start again in today's hash.
  redis.call('HSET', KEYS[4], 'reserved_day', day)
end
local used_tokens = (tonumber(job[5]) or 0) + (tonumber(job[6]) or 0)
local used_nusd = tonumber(job[7]) or 0
local function over(what, used, reserved, worst, limit)
  if limit and limit > 0 and used + reserved + worst > limit then
    return {4, what, tostring(used), tostring(reserved), tostring(limit)}
  end
end
local refusal = over('job_tokens', used_tokens, reserved_tokens, worst_tokens, tonumber(job[3]))
if refusal then return refusal end
if tonumber(job[4]) and tonumber(job[4]) > 0 and not worst_nusd then
  return {4, 'job_usd_unpriced', tostring(used_nusd), '0', job[4]}
end
refusal = over('job_usd', used_nusd, reserved_nusd, worst_nusd or 0, tonumber(job[4]))
if refusal then return refusal end
local owner = redis.call('HMGET', KEYS[5], 'input_tokens', 'output_tokens', 'cost_nusd', 'reserved_tokens',
  'reserved_nusd')
refusal = over('owner_tokens', (tonumber(owner[1]) or 0) + (tonumber(owner[2]) or 0), tonumber(owner[4]) or 0,
  worst_tokens, tonumber(ARGV[9]))
if refusal then return refusal end
if tonumber(ARGV[10]) > 0 and not worst_nusd then
  return {4, 'owner_usd_unpriced', tostring(tonumber(owner[3]) or 0), '0', ARGV[10]}
end
refusal = over('owner_usd', tonumber(owner[3]) or 0, tonumber(owner[5]) or 0, worst_nusd or 0, tonumber(ARGV[10]))
if refusal then return refusal end
redis.call('HINCRBY', KEYS[4], 'reserved_tokens', worst_tokens)
redis.call('HINCRBY', KEYS[5], 'reserved_tokens', worst_tokens)
if worst_nusd then
  redis.call('HINCRBY', KEYS[4], 'reserved_nusd', worst_nusd)
  redis.call('HINCRBY', KEYS[5], 'reserved_nusd', worst_nusd)
end
redis.call('EXPIRE', KEYS[5], tonumber(ARGV[11]))
return turn
