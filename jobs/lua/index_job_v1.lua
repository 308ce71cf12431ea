-- KEYS: job queued running succeeded failed expiries
-- index_job_v1: put one job in the right state index of its owner, whatever the indexes said
-- before: for jobs written before the indexes existed (the one-time indexing), and for jobs
-- moved by an older release's scripts while old and new workers overlap (the consistency
-- sweep). An ended job's entry is due when its record expires.
-- KEYS[1] job hash  KEYS[2..6] the owner's state indexes: queued, running, succeeded, failed
-- zsets and the expiries zset (jobs.keys.owner_state_indexes)
-- ARGV[1] job_id  ARGV[2] now  ARGV[3] seconds an ended job without a TTL is kept (result TTL)
-- Returns the job's state, or 'missing' (its record is gone: it leaves every index).
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  for i = 2, 6 do redis.call('ZREM', KEYS[i], ARGV[1]) end
  return 'missing'
end
local ttl = redis.call('TTL', KEYS[1])
if ttl < 0 then ttl = tonumber(ARGV[3]) end
local owner_indexes = {KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]}
index_state(owner_indexes, KEYS[1], ARGV[1], state, ARGV[2], ttl)
return state
