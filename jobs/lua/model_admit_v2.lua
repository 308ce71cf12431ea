-- model_admit_v2: may this job send its next model call (or provider batch)? One round trip that
-- takes the call's turn on the model's shared rate limit (as model_rate_v1 'acquire'), checks that
-- the attempt still holds its lease (a zombie spends nothing), and reserves the call's worst case
-- (prompt estimate + max_tokens) against the job's budget and the owner's daily budget, so calls
-- in flight at once cannot all slip under a line. Unlike model_admit_v1 (one pool per job, owned
-- by one attempt and dropped by the next), each call's reservation stands alone, with a deadline
-- after which the call can no longer be paid for: a dead attempt's calls stay reserved until
-- then, whichever attempt comes next, and free themselves after it. The write that stores the
-- answer settles it with the real usage, on the owner's day it was made (add_usage in _lib.lua).
-- KEYS[1] requests bucket  KEYS[2] tokens bucket  KEYS[3] paused-until (see model_rate_v1)
-- KEYS[4] job hash  KEYS[5] owner's usage for the UTC day  KEYS[6] the owner's reservations
-- (by deadline)  KEYS[7] their records
-- ARGV[1] now in ms ('' = Redis TIME)  ARGV[2] ms per request  ARGV[3] ms per token
-- ARGV[4] longest pause (ms) sat out in place  ARGV[5] attempt token
-- ARGV[6] worst-case tokens  ARGV[7] worst-case cost in nano-USD ('' = no price known)
-- ARGV[8] UTC day  ARGV[9] owner's daily tokens (0 = none)  ARGV[10] owner's daily nano-USD
-- (0 = none)  ARGV[11] owner day ttl (the reservations' keys live as long)
-- ARGV[12] now (unix seconds: the deadlines' clock)  ARGV[13] the reservation's id: one that
-- still stands (a call sent again after a 429) is kept, not reserved twice
-- ARGV[14] its deadline (unix seconds)  ARGV[15] most expired reservations given back here
-- ARGV[16..] reservations this one's deadline extends (the same item's earlier calls, whose
-- usage is written with it)
-- Returns {0, w, day} admitted, start after w ms, counted on the UTC day `day` (the kept
-- reservation's); {1, w} / {2, w} as rate_acquire (nothing reserved); {3} the lease is lost;
-- {4, what, used, reserved, limit} over a budget, what is 'job_tokens' | 'job_usd' |
-- 'owner_tokens' | 'owner_usd' | 'job_usd_unpriced' | 'owner_usd_unpriced'.
local now = now_ms(ARGV[1])
local turn = rate_acquire(KEYS[1], KEYS[2], KEYS[3], now, tonumber(ARGV[2]) or 0, tonumber(ARGV[3]) or 0,
  tonumber(ARGV[4]) or 0)
if turn[1] ~= 0 then return turn end
local lease = redis.call('HMGET', KEYS[4], 'state', 'token', 'reserved_by')
if lease[1] ~= 'running' or lease[2] ~= ARGV[5] then return {3} end
local day, id, deadline = ARGV[8], ARGV[13], tonumber(ARGV[14])
if lease[3] then drop_job_pool(KEYS[4], KEYS[5], day) end
-- Calls that can no longer be paid for give their reservations back (a bounded number per
-- admission: an owner with many dead ones pays a little on each call until they are gone).
for _, expired in ipairs(redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', ARGV[12], 'LIMIT', 0, tonumber(ARGV[15]))) do
  release_reservation(KEYS[6], KEYS[7], expired)
end
for i = 16, #ARGV do redis.call('ZADD', KEYS[6], 'XX', 'GT', deadline, ARGV[i]) end
if redis.call('ZSCORE', KEYS[6], id) then
  redis.call('ZADD', KEYS[6], 'XX', 'GT', deadline, id)
  local kept = cjson.decode(redis.call('HGET', KEYS[7], id) or '{}')
  return {0, turn[2], kept.day or day}
end
local job = redis.call('HMGET', KEYS[4], 'budget_tokens', 'budget_nusd', 'usage_input_tokens', 'usage_output_tokens',
  'usage_cost_nusd', 'in_flight_tokens', 'in_flight_nusd')
local worst_tokens = tonumber(ARGV[6]) or 0
local worst_nusd = tonumber(ARGV[7])
local used_tokens = (tonumber(job[3]) or 0) + (tonumber(job[4]) or 0)
local used_nusd = tonumber(job[5]) or 0
local function over(what, used, reserved, worst, limit)
  if limit and limit > 0 and used + reserved + worst > limit then
    return {4, what, tostring(used), tostring(reserved), tostring(limit)}
  end
end
local refusal = over('job_tokens', used_tokens, tonumber(job[6]) or 0, worst_tokens, tonumber(job[1]))
if refusal then return refusal end
if tonumber(job[2]) and tonumber(job[2]) > 0 and not worst_nusd then
  return {4, 'job_usd_unpriced', tostring(used_nusd), '0', job[2]}
end
refusal = over('job_usd', used_nusd, tonumber(job[7]) or 0, worst_nusd or 0, tonumber(job[2]))
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
redis.call('ZADD', KEYS[6], deadline, id)
-- Amounts as strings: cjson would write a large number with 14 digits.
redis.call('HSET', KEYS[7], id, cjson.encode({job = KEYS[4], day_key = KEYS[5], day = day,
  t = string.format('%d', worst_tokens), n = string.format('%d', worst_nusd or 0)}))
redis.call('HINCRBY', KEYS[4], 'in_flight_tokens', worst_tokens)
redis.call('HINCRBY', KEYS[5], 'reserved_tokens', worst_tokens)
if worst_nusd then
  redis.call('HINCRBY', KEYS[4], 'in_flight_nusd', worst_nusd)
  redis.call('HINCRBY', KEYS[5], 'reserved_nusd', worst_nusd)
end
keep_for(ARGV[11], KEYS[5], KEYS[6], KEYS[7])
return {0, turn[2], day}
