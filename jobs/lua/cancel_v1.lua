-- KEYS: job cancels items errors kind_minute all_minute totals failed_index payload
-- cancel_v1: ask a job to stop. A queued job fails at once with "canceled"; a running job
-- gets a flag its next heartbeat sees (cooperative), and a hard-stop deadline for the reaper.
-- KEYS[1] job hash  KEYS[2] cancels zset  KEYS[3] items hash  KEYS[4] errors list
-- KEYS[5] failed-this-minute counter for the kind  KEYS[6] same for all kinds
-- KEYS[7] all-time totals hash  KEYS[8] failed index zset  KEYS[9] payload copy
-- ARGV[1] job_id  ARGV[2] now  ARGV[3] hard-stop deadline  ARGV[4] ttl seconds
-- ARGV[5] error-history entry JSON  ARGV[6] totals field ("failed:<kind>")
-- ARGV[7] per-minute counter ttl
-- Returns the state the job was in ('missing' when unknown).
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return 'missing' end
if state == 'queued' then
  redis.call('HSET', KEYS[1], 'state', 'failed', 'error', 'canceled', 'updated_at', ARGV[2],
    'ended_at', ARGV[2], 'cancel_requested', '1')
  redis.call('RPUSH', KEYS[4], ARGV[5])
  keep_for(ARGV[4], KEYS[1], KEYS[3], KEYS[4], KEYS[9])
  count_outcome(KEYS[5], KEYS[6], KEYS[7], ARGV[6], ARGV[7])
  redis.call('ZADD', KEYS[8], tonumber(ARGV[2]), ARGV[1])
elseif state == 'running' then
  redis.call('HSET', KEYS[1], 'cancel_requested', '1')
  redis.call('ZADD', KEYS[2], tonumber(ARGV[3]), ARGV[1])
end
return state
