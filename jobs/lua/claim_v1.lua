-- KEYS: job leases history
-- claim_v1: start a new attempt on a queued job; hands out the attempt's fencing token.
-- KEYS[1] job hash   KEYS[2] leases zset   KEYS[3] attempt history list
-- ARGV[1] job_id  ARGV[2] now  ARGV[3] lease_seconds  ARGV[4] worker name
-- ARGV[5] seconds the history is kept (longer than the job's record: see jobs/lease.py)
-- Returns {1, token, attempts, kind} or {0, current_state} when the job is not claimable
-- (already running under another attempt, terminal, or unknown).
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'queued' then
  return {0, state or 'missing'}
end
local now = tonumber(ARGV[2])
local expires = now + tonumber(ARGV[3])
local token = redis.call('HINCRBY', KEYS[1], 'token', 1)
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
return {1, token, attempts, redis.call('HGET', KEYS[1], 'kind') or ''}
