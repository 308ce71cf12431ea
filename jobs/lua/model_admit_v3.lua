-- KEYS: requests tokens paused job owner_day reservations reservation_records model_usage reservation_owners
-- model_admit_v3: may this job send its next model call (or provider batch)? One round trip that
-- checks that the attempt still holds its lease (a zombie spends nothing), reserves the call's
-- worst case (its input bound + max_tokens) against the job's budget and the owner's daily
-- budget, so calls in flight at once cannot all slip under a line, and takes the call's turn on
-- the model's shared rate limit (as model_rate_v1 'acquire'). Each reservation stands alone,
-- with a deadline after which the call can no longer be paid for; the write that stores the
-- answer settles it with the real usage (add_usage in _lib.lua). A reservation whose deadline
-- passed unsettled is a call leash abandoned (its work-horse killed): it is counted as an
-- estimated call (estimate_abandoned). A refusal says how much of what is reserved belongs to
-- other calls (they can free room: the caller waits for them) and marks the job as waiting.
-- KEYS[1] requests bucket  KEYS[2] tokens bucket  KEYS[3] paused-until (see model_rate_v1)
-- KEYS[4] job hash  KEYS[5] owner's usage for the UTC day  KEYS[6] the owner's reservations
-- (by deadline)  KEYS[7] their records  KEYS[8] the model's usage totals  KEYS[9] owners with
-- reservations, by their earliest deadline (the reaper counts abandoned calls of owners that
-- make no more: reservations_sweep_v1)
-- ARGV[1] now in ms ('' = Redis TIME)  ARGV[2] ms per request  ARGV[3] ms per token
-- ARGV[4] longest pause (ms) sat out in place  ARGV[5] attempt token
-- ARGV[6] worst-case tokens  ARGV[7] worst-case cost in nano-USD ('' = no price known)
-- ARGV[8] UTC day  ARGV[9] owner's daily tokens (0 = none)  ARGV[10] owner's daily nano-USD
-- (0 = none)  ARGV[11] owner day ttl (the reservations' keys live as long)
-- ARGV[12] now (unix seconds: the deadlines' clock)  ARGV[13] the reservation's id: one that
-- still stands (a call sent again after a 429) is kept, not reserved twice
-- ARGV[14] its deadline (unix seconds)  ARGV[15] most expired reservations given back here
-- ARGV[16] the call's input tokens, estimated  ARGV[17] their cost in nano-USD  ARGV[18] the
-- model  ARGV[19] the job's kind  ARGV[20] its output tokens at most ('' for a provider batch:
-- not counted as abandoned when it expires, its reads settle it)
-- ARGV[21] the owner (its name in KEYS[9])  ARGV[22..] reservations this one's deadline extends
-- (the same item's earlier calls, whose usage is written with it)
-- Returns {0, w, day} admitted, start after w ms, counted on the UTC day `day` (the kept
-- reservation's); {1, w} / {2, w} as rate_acquire (nothing reserved); {3} the lease is lost;
-- {4, what, used, reserved, limit, others} over a budget, what is 'job_tokens' | 'job_usd' |
-- 'owner_tokens' | 'owner_usd' | 'job_usd_unpriced' | 'owner_usd_unpriced', others: the part of
-- `reserved` held by other calls than ARGV[22..] (0: nothing in flight can free room).
local lease = redis.call('HMGET', KEYS[4], 'state', 'token', 'reserved_by')
if lease[1] ~= 'running' or lease[2] ~= ARGV[5] then return {3} end
local day, id, deadline = ARGV[8], ARGV[13], tonumber(ARGV[14])
if lease[3] then drop_job_pool(KEYS[4], KEYS[5], day) end
-- Calls that can no longer be paid for give their reservations back (a bounded number per
-- admission: an owner with many dead ones pays a little on each call until they are gone).
for _, expired in ipairs(redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', ARGV[12], 'LIMIT', 0, tonumber(ARGV[15]))) do
  local r = release_reservation(KEYS[6], KEYS[7], expired)
  if r and r.i then estimate_abandoned(KEYS[6], KEYS[7], expired, r, ARGV[12]) end
end
local function take_turn()
  return rate_acquire(KEYS[1], KEYS[2], KEYS[3], now_ms(ARGV[1]), tonumber(ARGV[2]) or 0, tonumber(ARGV[3]) or 0,
    tonumber(ARGV[4]) or 0)
end
local own_tokens, own_nusd = 0, 0
for i = 22, #ARGV do
  redis.call('ZADD', KEYS[6], 'XX', 'GT', deadline, ARGV[i])
  local raw = redis.call('HGET', KEYS[7], ARGV[i])
  if raw then
    local r = cjson.decode(raw)
    own_tokens, own_nusd = own_tokens + (tonumber(r.t) or 0), own_nusd + (tonumber(r.n) or 0)
  end
end
if redis.call('ZSCORE', KEYS[6], id) then
  local turn = take_turn()
  if turn[1] ~= 0 then return turn end
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
local function over(what, used, reserved, worst, limit, own)
  if limit and limit > 0 and used + reserved + worst > limit then
    local others = math.max(0, reserved - own)
    if others > 0 then redis.call('HSETNX', KEYS[4], 'budget_wait', what .. '|' .. ARGV[12]) end
    return {4, what, tostring(used), tostring(reserved), tostring(limit), tostring(others)}
  end
end
local refusal = over('job_tokens', used_tokens, tonumber(job[6]) or 0, worst_tokens, tonumber(job[1]), own_tokens)
if refusal then return refusal end
if tonumber(job[2]) and tonumber(job[2]) > 0 and not worst_nusd then
  return {4, 'job_usd_unpriced', tostring(used_nusd), '0', job[2], '0'}
end
refusal = over('job_usd', used_nusd, tonumber(job[7]) or 0, worst_nusd or 0, tonumber(job[2]), own_nusd)
if refusal then return refusal end
local owner = redis.call('HMGET', KEYS[5], 'input_tokens', 'output_tokens', 'cost_nusd', 'reserved_tokens',
  'reserved_nusd')
refusal = over('owner_tokens', (tonumber(owner[1]) or 0) + (tonumber(owner[2]) or 0), tonumber(owner[4]) or 0,
  worst_tokens, tonumber(ARGV[9]), own_tokens)
if refusal then return refusal end
if tonumber(ARGV[10]) > 0 and not worst_nusd then
  return {4, 'owner_usd_unpriced', tostring(tonumber(owner[3]) or 0), '0', ARGV[10], '0'}
end
refusal = over('owner_usd', tonumber(owner[3]) or 0, tonumber(owner[5]) or 0, worst_nusd or 0, tonumber(ARGV[10]),
  own_nusd)
if refusal then return refusal end
-- The budgets have room: now the rate limit's turn (a call refused above spent none).
local turn = take_turn()
if turn[1] ~= 0 then return turn end
redis.call('HDEL', KEYS[4], 'budget_wait')
redis.call('ZADD', KEYS[6], deadline, id)
-- Amounts as strings: cjson would write a large number with 14 digits.
local record = {job = KEYS[4], day_key = KEYS[5], day = day, t = string.format('%d', worst_tokens),
  n = string.format('%d', worst_nusd or 0)}
if ARGV[20] ~= '' then
  record.i, record.ni, record.o = ARGV[16], ARGV[17], ARGV[20]
  record.m, record.k, record.mk, record.p = ARGV[18], ARGV[19], KEYS[8], worst_nusd and '1' or '0'
end
redis.call('HSET', KEYS[7], id, cjson.encode(record))
redis.call('ZADD', KEYS[9], 'LT', deadline, ARGV[21])
redis.call('HINCRBY', KEYS[4], 'in_flight_tokens', worst_tokens)
redis.call('HINCRBY', KEYS[5], 'reserved_tokens', worst_tokens)
if worst_nusd then
  redis.call('HINCRBY', KEYS[4], 'in_flight_nusd', worst_nusd)
  redis.call('HINCRBY', KEYS[5], 'reserved_nusd', worst_nusd)
end
keep_for(ARGV[11], KEYS[5], KEYS[6], KEYS[7])
return {0, turn[2], day}
