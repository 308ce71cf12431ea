-- KEYS: job leases items errors rejected_writes kind_minute all_minute totals failed_index payload queued running succeeded failed expiries
-- fail_v2: the attempt holding the token ended in an error. It goes back to queued while
-- attempts remain (the caller then lets RQ's Retry schedule it), else to failed. The error
-- text is always stored: failed is never reached without it.
-- KEYS[1] job hash  KEYS[2] leases zset  KEYS[3] items hash  KEYS[4] errors list
-- KEYS[5] rejected-writes counter  KEYS[6] failed-this-minute counter for the kind
-- KEYS[7] same for all kinds  KEYS[8] all-time totals hash  KEYS[9] failed index zset
-- KEYS[10] payload copy
-- KEYS[11..15] the owner's state indexes: queued, running, succeeded, failed zsets and
-- the expiries zset (jobs.keys.owner_state_indexes); the job moves between them here
-- ARGV[1] job_id  ARGV[2] token  ARGV[3] now  ARGV[4] error text  ARGV[5] permanent (1/0)
-- ARGV[6] ttl seconds  ARGV[7] error-history entry JSON  ARGV[8] totals field ("failed:<kind>")
-- ARGV[9] per-minute counter ttl
-- Returns {1, new_state, attempts, max_attempts} or {0} when the token is superseded.
if not holds_lease(KEYS[1], ARGV[2], KEYS[5]) then return {0} end
local attempts = tonumber(redis.call('HGET', KEYS[1], 'attempts') or '0')
local max_attempts = tonumber(redis.call('HGET', KEYS[1], 'max_attempts') or '1')
local new_state = 'queued'
if ARGV[5] == '1' or attempts >= max_attempts then
  new_state = 'failed'
end
redis.call('HSET', KEYS[1], 'state', new_state, 'error', ARGV[4], 'updated_at', ARGV[3],
  'lease_expires_at', '', 'cancel_requested', '0')
redis.call('RPUSH', KEYS[4], ARGV[7])
redis.call('ZREM', KEYS[2], ARGV[1])
local owner_indexes = {KEYS[11], KEYS[12], KEYS[13], KEYS[14], KEYS[15]}
index_state(owner_indexes, KEYS[1], ARGV[1], new_state, ARGV[3], ARGV[6])
if new_state == 'failed' then
  redis.call('HSET', KEYS[1], 'ended_at', ARGV[3])
  keep_for(ARGV[6], KEYS[1], KEYS[3], KEYS[4], KEYS[10])
  count_outcome(KEYS[6], KEYS[7], KEYS[8], ARGV[8], ARGV[9])
  redis.call('ZADD', KEYS[9], tonumber(ARGV[3]), ARGV[1])
end
return {1, new_state, attempts, max_attempts}
