-- KEYS: job leases errors rq_job rq_queue rq_started rq_executions rq_failed reclaims items kind_minute all_minute totals failed_index payload queued running succeeded failed expiries
-- reclaim_v2: a running job whose lease has expired (worker died, hung or was stopped) is
-- taken back. The lost attempt counts: back to the front of its RQ queue while attempts
-- remain, else failed with the "lease expired" error. Any later write from the old attempt
-- is refused, because the state is no longer running under its token.
-- KEYS[1] job hash  KEYS[2] leases zset  KEYS[3] errors list  KEYS[4] rq job hash
-- KEYS[5] rq queue list  KEYS[6] rq started registry  KEYS[7] rq executions zset
-- KEYS[8] rq failed registry  KEYS[9] reclaims counter  KEYS[10] items hash
-- KEYS[11] failed-this-minute counter for the kind  KEYS[12] same for all kinds
-- KEYS[13] all-time totals hash  KEYS[14] failed index zset  KEYS[15] payload copy
-- KEYS[16..20] the owner's state indexes: queued, running, succeeded, failed zsets and
-- the expiries zset (jobs.keys.owner_state_indexes); the job moves between them here
-- ARGV[1] job_id  ARGV[2] now  ARGV[3] error text  ARGV[4] error-history entry JSON
-- ARGV[5] ttl seconds  ARGV[6] enqueued_at (RQ's format)
-- ARGV[7] expected token ('' = any token whose lease has expired)
-- ARGV[8] totals field ("failed:<kind>")  ARGV[9] per-minute counter ttl
-- Returns {1, new_state, attempts} or {0, reason}.
local fields = redis.call('HMGET', KEYS[1], 'state', 'lease_expires_at', 'attempts', 'max_attempts', 'token')
local state, expires = fields[1], tonumber(fields[2] or '')
if state ~= 'running' then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return {0, 'not running'}
end
if ARGV[7] ~= '' then
  if fields[5] ~= ARGV[7] then return {0, 'superseded'} end
elseif expires ~= nil and expires > tonumber(ARGV[2]) then
  return {0, 'lease alive'}
end
local attempts = tonumber(fields[3] or '0')
local max_attempts = tonumber(fields[4] or '1')
local new_state = 'queued'
if attempts >= max_attempts then new_state = 'failed' end
redis.call('HSET', KEYS[1], 'state', new_state, 'error', ARGV[3], 'updated_at', ARGV[2],
  'lease_expires_at', '')
redis.call('RPUSH', KEYS[3], ARGV[4])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('INCR', KEYS[9])
for _, execution_id in ipairs(redis.call('ZRANGE', KEYS[7], 0, -1)) do
  redis.call('ZREM', KEYS[6], ARGV[1] .. ':' .. execution_id)
end
local owner_indexes = {KEYS[16], KEYS[17], KEYS[18], KEYS[19], KEYS[20]}
index_state(owner_indexes, KEYS[1], ARGV[1], new_state, ARGV[2], ARGV[5])
if new_state == 'queued' then
  redis.call('HSET', KEYS[4], 'status', 'queued', 'enqueued_at', ARGV[6],
    'retries_left', tostring(max_attempts - attempts))
  redis.call('LREM', KEYS[5], 0, ARGV[1])
  redis.call('LPUSH', KEYS[5], ARGV[1])
else
  redis.call('HSET', KEYS[1], 'ended_at', ARGV[2])
  redis.call('HSET', KEYS[4], 'status', 'failed', 'retries_left', '0')
  redis.call('ZADD', KEYS[8], tonumber(ARGV[2]) + tonumber(ARGV[5]), ARGV[1])
  keep_for(ARGV[5], KEYS[1], KEYS[3], KEYS[10], KEYS[4], KEYS[15])
  count_outcome(KEYS[11], KEYS[12], KEYS[13], ARGV[8], ARGV[9])
  redis.call('ZADD', KEYS[14], tonumber(ARGV[2]), ARGV[1])
end
return {1, new_state, attempts}
