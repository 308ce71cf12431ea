-- KEYS: job cancels items errors kind_minute all_minute totals failed_index payload queued running succeeded failed expiries leases owner_day reservations reservation_records
-- cancel_v3: ask a job to stop. A queued job fails at once with "canceled"; a running job
-- gets a flag its next heartbeat sees (cooperative), and a hard-stop deadline for the reaper.
-- A batch job waiting at its provider (park_v1) has no worker to see the flag: it fails at once
-- too, the reservations of its provider batches are given back (they will never be settled),
-- and the answer 'waiting' tells the caller to cancel the provider's batch.
-- KEYS[1] job hash  KEYS[2] cancels zset  KEYS[3] items hash  KEYS[4] errors list
-- KEYS[5] failed-this-minute counter for the kind  KEYS[6] same for all kinds
-- KEYS[7] all-time totals hash  KEYS[8] failed index zset  KEYS[9] payload copy
-- KEYS[10..14] the owner's state indexes: queued, running, succeeded, failed zsets and
-- the expiries zset (jobs.keys.owner_state_indexes); the job moves between them here
-- KEYS[15] leases zset  KEYS[16] the owner's usage for the day of a reservation held in the
-- job hash (one pool per job, as older releases reserved)  KEYS[17] the owner's reservations
-- (by deadline)  KEYS[18] their records
-- ARGV[1] job_id  ARGV[2] now  ARGV[3] hard-stop deadline  ARGV[4] ttl seconds
-- ARGV[5] error-history entry JSON  ARGV[6] totals field ("failed:<kind>")
-- ARGV[7] per-minute counter ttl  ARGV[8..] the reservations of the job's provider batches
-- Returns the state the job was in ('missing' when unknown; 'waiting' for a waiting batch job).
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return 'missing' end
local phase = redis.call('HGET', KEYS[1], 'phase')
local waiting = state == 'running' and phase == 'waiting'
if state == 'queued' or waiting then
  redis.call('HSET', KEYS[1], 'state', 'failed', 'error', 'canceled', 'updated_at', ARGV[2],
    'ended_at', ARGV[2], 'cancel_requested', '1')
  redis.call('RPUSH', KEYS[4], ARGV[5])
  keep_for(ARGV[4], KEYS[1], KEYS[3], KEYS[4], KEYS[9])
  count_outcome(KEYS[5], KEYS[6], KEYS[7], ARGV[6], ARGV[7])
  redis.call('ZADD', KEYS[8], tonumber(ARGV[2]), ARGV[1])
  local owner_indexes = {KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14]}
  index_state(owner_indexes, KEYS[1], ARGV[1], 'failed', ARGV[2], ARGV[4])
  if waiting then
    redis.call('ZREM', KEYS[15], ARGV[1])
    redis.call('HSET', KEYS[1], 'lease_expires_at', '')
    for _, f in ipairs({'reserved_tokens', 'reserved_nusd'}) do
      local n = tonumber(redis.call('HGET', KEYS[1], f) or '0') or 0
      if n > 0 and redis.call('EXISTS', KEYS[16]) == 1 then
        if redis.call('HINCRBY', KEYS[16], f, -n) < 0 then redis.call('HSET', KEYS[16], f, 0) end
      end
      redis.call('HSET', KEYS[1], f, 0)
    end
    for i = 8, #ARGV do release_reservation(KEYS[17], KEYS[18], ARGV[i]) end
    return 'waiting'
  end
elseif state == 'running' then
  redis.call('HSET', KEYS[1], 'cancel_requested', '1')
  redis.call('ZADD', KEYS[2], tonumber(ARGV[3]), ARGV[1])
end
return state
