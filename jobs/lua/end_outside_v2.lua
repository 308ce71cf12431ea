-- KEYS: job errors items payload failed_index active kind_minute all_minute totals queued running succeeded failed expiries
-- end_outside_v2: a queued job that RQ's own tools ended behind leash's back (deleted, emptied,
-- failed or canceled in RQ, or run by a plain RQ worker) becomes failed with a stored error, so
-- it is listed by `leash failures` and replayable. Nothing happens unless it is still queued.
-- KEYS[1] job hash  KEYS[2] errors list  KEYS[3] items hash  KEYS[4] payload copy
-- KEYS[5] failed index zset  KEYS[6] active index zset
-- KEYS[7] failed-this-minute counter for the kind  KEYS[8] same for all kinds
-- KEYS[9] all-time totals hash
-- KEYS[10..14] the owner's state indexes: queued, running, succeeded, failed zsets and
-- the expiries zset (jobs.keys.owner_state_indexes); the job moves between them here
-- ARGV[1] job_id  ARGV[2] now  ARGV[3] error text  ARGV[4] error-history entry JSON
-- ARGV[5] ttl seconds  ARGV[6] totals field ("failed:<kind>")  ARGV[7] per-minute counter ttl
-- Returns 1 when the job was failed, else 0.
if redis.call('HGET', KEYS[1], 'state') ~= 'queued' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'failed', 'error', ARGV[3], 'updated_at', ARGV[2],
  'ended_at', ARGV[2], 'lease_expires_at', '')
redis.call('RPUSH', KEYS[2], ARGV[4])
redis.call('ZADD', KEYS[5], tonumber(ARGV[2]), ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
keep_for(ARGV[5], KEYS[1], KEYS[2], KEYS[3], KEYS[4])
count_outcome(KEYS[7], KEYS[8], KEYS[9], ARGV[6], ARGV[7])
local owner_indexes = {KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14]}
index_state(owner_indexes, KEYS[1], ARGV[1], 'failed', ARGV[2], ARGV[5])
return 1
