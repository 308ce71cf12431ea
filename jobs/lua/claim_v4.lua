-- KEYS: job leases history queued running succeeded failed expiries
-- claim_v4: start a new attempt on a queued job, or a look at a batch job waiting at its
-- provider (park_v1): the attempt's fencing token and lease. A look is not a new attempt: the
-- attempt count and the attempt history stay as they are (the attempt that created the batch
-- is still the job's current one), only a fresh token (made the same way) and a lease are
-- handed out, and the job's budget reservation moves to the new token so the items this look
-- stores settle it.
-- The token is max(last token, ARGV[6]) + 1 + ARGV[7]: ARGV[6] the worker's clock in
-- microseconds, ARGV[7] a random number below 2^20 it drew. A count (1, 2, 3...) would not
-- fence: a Redis failover that loses the last writes (async replication) rolls the count back
-- with the claim, and the next claim would get the very token the lost claim's worker still
-- holds. A lost claim and the one that replaces it match only if they drew the same number.
-- Tokens stay integers below 2^53: exact in Lua, and HINCRBY on the token (park_v1, and the
-- previous release's claim_v1 during a deploy) still works on them.
-- KEYS[1] job hash   KEYS[2] leases zset   KEYS[3] attempt history list
-- KEYS[4..8] the owner's state indexes: queued, running, succeeded, failed zsets and
-- the expiries zset (jobs.keys.owner_state_indexes); the job moves between them here
-- ARGV[1] job_id  ARGV[2] now  ARGV[3] lease_seconds  ARGV[4] worker name
-- ARGV[5] seconds the history is kept (longer than the job's record: see jobs/lease.py)
-- ARGV[6] now in microseconds  ARGV[7] a random integer in [0, 2^20)
-- Returns {1, token, attempts, kind, look} (look: '1' for a look at a waiting batch, else '0')
-- or {0, current_state} when the job is not claimable (already running under another attempt,
-- terminal, or unknown).
local fields = redis.call('HMGET', KEYS[1], 'state', 'phase', 'token', 'reserved_by')
local state = fields[1]
local now = tonumber(ARGV[2])
local expires = now + tonumber(ARGV[3])
if state == 'running' and fields[2] == 'waiting' then
  local last = tonumber(fields[3] or '0') or 0
  local token = string.format('%d', math.max(last, tonumber(ARGV[6])) + 1 + tonumber(ARGV[7]))
  redis.call('HSET', KEYS[1], 'token', token)
  if fields[4] and fields[4] == fields[3] then
    redis.call('HSET', KEYS[1], 'reserved_by', token)
  end
  redis.call('HSET', KEYS[1], 'phase', 'looking', 'looking_worker', ARGV[4],
    'lease_expires_at', tostring(expires), 'looked_at', ARGV[2])
  redis.call('ZADD', KEYS[2], expires, ARGV[1])
  return {1, token, tonumber(redis.call('HGET', KEYS[1], 'attempts') or '0'),
    redis.call('HGET', KEYS[1], 'kind') or '', '1'}
end
if state ~= 'queued' then
  return {0, state or 'missing'}
end
local last = tonumber(redis.call('HGET', KEYS[1], 'token') or '0') or 0
local token = string.format('%d', math.max(last, tonumber(ARGV[6])) + 1 + tonumber(ARGV[7]))
redis.call('HSET', KEYS[1], 'token', token)
local attempts = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
redis.call('HSET', KEYS[1], 'state', 'running', 'worker', ARGV[4],
  'lease_expires_at', tostring(expires), 'updated_at', ARGV[2], 'started_at', ARGV[2],
  'done_at_start', redis.call('HGET', KEYS[1], 'done') or '0')
redis.call('HDEL', KEYS[1], 'phase')
-- When the job first started (elapsed time), and who ran each attempt (the job's page); "at"
-- stays the string it came as: cjson would round a number to 14 digits (a millisecond off).
redis.call('HSETNX', KEYS[1], 'first_started_at', ARGV[2])
redis.call('RPUSH', KEYS[3], cjson.encode({attempt = attempts, at = ARGV[2], worker = ARGV[4]}))
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[5]))
redis.call('ZADD', KEYS[2], expires, ARGV[1])
local owner_indexes = {KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]}
index_state(owner_indexes, KEYS[1], ARGV[1], 'running', ARGV[2], 0)
return {1, token, attempts, redis.call('HGET', KEYS[1], 'kind') or '', '0'}
