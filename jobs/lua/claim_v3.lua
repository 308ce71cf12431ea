-- claim_v3: claim_v2 with a fencing token that no failover can hand out twice.
-- claim_v2's token counted 1, 2, 3...: a Redis failover that loses the last writes (async
-- replication) rolled the count back with the claim, and the next claim got the very token
-- the lost claim's worker still held, so both passed the fence. Here the token is
-- max(last token, ARGV[6]) + 1 + ARGV[7]: ARGV[6] the worker's clock in microseconds,
-- ARGV[7] a random number below 2^20 it drew; a lost claim and the one that replaces it
-- match only if they drew the same number. Tokens stay integers below 2^53 (exact in Lua,
-- and claim_v2's HINCRBY, run by an older worker during a deploy, still works on them).
-- KEYS[1] job hash   KEYS[2] leases zset   KEYS[3] attempt history list
-- ARGV[1] job_id  ARGV[2] now  ARGV[3] lease_seconds  ARGV[4] worker name
-- ARGV[5] seconds the history is kept (longer than the job's record: see jobs/lease.py)
-- ARGV[6] now in microseconds  ARGV[7] a random integer in [0, 2^20)
-- Returns {1, token, attempts, kind} or {0, current_state} when the job is not claimable
-- (already running under another attempt, terminal, or unknown).
-- KEYS[4..8] the owner's state indexes: queued, running, succeeded, failed zsets and
-- the expiries zset (jobs.keys.owner_state_indexes); the job moves between them here.
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'queued' then
  return {0, state or 'missing'}
end
local now = tonumber(ARGV[2])
local expires = now + tonumber(ARGV[3])
local last = tonumber(redis.call('HGET', KEYS[1], 'token') or '0') or 0
local token = string.format('%d', math.max(last, tonumber(ARGV[6])) + 1 + tonumber(ARGV[7]))
redis.call('HSET', KEYS[1], 'token', token)
local attempts = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
redis.call('HSET', KEYS[1], 'state', 'running', 'worker', ARGV[4],
  'lease_expires_at', tostring(expires), 'updated_at', ARGV[2], 'started_at', ARGV[2],
  'done_at_start', redis.call('HGET', KEYS[1], 'done') or '0')
-- When the job first started (elapsed time), and who ran each attempt (the job's page); "at"
-- stays the string it came as: cjson would round a number to 14 digits (a millisecond off).
redis.call('HSETNX', KEYS[1], 'first_started_at', ARGV[2])
redis.call('RPUSH', KEYS[3], cjson.encode({attempt = attempts, at = ARGV[2], worker = ARGV[4]}))
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[5]))
redis.call('ZADD', KEYS[2], expires, ARGV[1])
index_state(4, KEYS[1], ARGV[1], 'running', ARGV[2], 0)
return {1, token, attempts, redis.call('HGET', KEYS[1], 'kind') or ''}
