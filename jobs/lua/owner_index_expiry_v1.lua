-- KEYS: owner_jobs queued running succeeded failed expiries state_index_ready
-- owner_index_expiry_v1: an owner's indexes leave with the jobs they list. Drops the entries
-- of ended jobs whose records have expired (due in the owner's expiries) from every index of
-- the owner, then gives the owner's job index (keys.owner_jobs, which has no TTL of its own)
-- one reaching the expiry of its newest ended job while the owner has no queued or running
-- job, and none while it has one: it never outlives the jobs it lists and never drops a live
-- one. Until every job written before the state indexes has been indexed (the marker key),
-- the TTL is left alone: an unindexed queued job would not be seen.
-- KEYS[1] the owner's jobs zset  KEYS[2..6] the owner's state indexes: queued, running,
-- succeeded, failed zsets and the expiries zset (jobs.keys.owner_state_indexes)
-- KEYS[7] the state indexes' ready marker (keys.STATE_INDEX_READY)
-- ARGV[1] now  ARGV[2] most entries dropped in one call
-- Returns {entries dropped, 1 if more are due}.
local due = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, job_id in ipairs(due) do
  for _, key in ipairs({KEYS[1], KEYS[4], KEYS[5], KEYS[6]}) do redis.call('ZREM', key, job_id) end
end
local more = 0
if #due == tonumber(ARGV[2]) then more = 1 end
if redis.call('EXISTS', KEYS[7]) == 1 then
  if redis.call('ZCARD', KEYS[2]) + redis.call('ZCARD', KEYS[3]) > 0 then
    redis.call('PERSIST', KEYS[1])
  else
    local newest = redis.call('ZRANGE', KEYS[6], -1, -1, 'WITHSCORES')
    if newest[2] then
      redis.call('EXPIREAT', KEYS[1], math.ceil(tonumber(newest[2])) + 1)
    elseif redis.call('ZCARD', KEYS[1]) > 0 and redis.call('ZCARD', KEYS[4]) + redis.call('ZCARD', KEYS[5]) == 0 then
      -- Entries left of jobs no index knows (their records gone): nothing to list.
      redis.call('DEL', KEYS[1])
    end
  end
end
return {#due, more}
