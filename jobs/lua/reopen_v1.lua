-- KEYS: job items queued running succeeded failed expiries
-- reopen_v1: the first step of asking a job's errored items again (`leash replay --errored-items`,
-- the job page's "Retry the errored items"): the results of its items that ended in an error
-- leave its items hash (its answered items stay: the replay resumes from them, and they cost
-- nothing again), and a job that succeeded with item errors reads failed, with the given text, so
-- that the replay (replay_v4) takes it like any failed job. A failed job keeps its state.
-- KEYS[1] job hash  KEYS[2] items hash
-- KEYS[3..7] the owner's state indexes: queued, running, succeeded, failed zsets and the
-- expiries zset (jobs.keys.owner_state_indexes); the job moves between them here
-- ARGV[1] job_id  ARGV[2] now  ARGV[3] the error a reopened succeeded job reads until it is
-- replayed  ARGV[4] ttl seconds (LEASH_RESULT_TTL)  ARGV[5..] the indexes of its errored items
-- Returns the state the job was in ('missing' without a hash); only a succeeded or failed job
-- is changed.
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return 'missing' end
if state ~= 'succeeded' and state ~= 'failed' then return state end
for i = 5, #ARGV do redis.call('HDEL', KEYS[2], ARGV[i]) end
redis.call('HSET', KEYS[1], 'done', tostring(redis.call('HLEN', KEYS[2])), 'item_errors', '0')
if state == 'succeeded' then
  redis.call('HSET', KEYS[1], 'state', 'failed', 'error', ARGV[3], 'updated_at', ARGV[2])
  redis.call('HDEL', KEYS[1], 'result')
  index_state({KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]}, KEYS[1], ARGV[1], 'failed', ARGV[2], ARGV[4])
end
return state
