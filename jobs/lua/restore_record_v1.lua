-- KEYS: job errors history estimate failed_index owner_jobs queued running succeeded failed expiries
-- restore_record_v1: an ended job's record back in Redis from the archive once Redis lost it (a
-- restart without persistence, a failover to an empty replica, FLUSHALL), so that a replay can run
-- it: its hash (marked archived, as of the ending the archive holds), its error and attempt history
-- and its estimate, each kept for what its record had left; its place in its owner's job list and
-- state index and, failed (canceled too), in the failed index, as its end left them. Its payload
-- copy, results and usage come back after it (jobs/archive/restore.py: the replay's own restore).
-- Nothing is written while Redis holds a record of the job (a replay or a restore got there
-- first).
-- KEYS[1] job hash  KEYS[2] errors list  KEYS[3] history list  KEYS[4] estimate
-- KEYS[5] failed index zset  KEYS[6] the owner's jobs zset
-- KEYS[7..11] the owner's state indexes: queued, running, succeeded, failed zsets and the
-- expiries zset (jobs.keys.owner_state_indexes)
-- ARGV[1] job_id  ARGV[2] now  ARGV[3] seconds it is kept
-- ARGV[4] the record: a JSON object of its fields, as text  ARGV[5] the errors list's entries and
-- ARGV[6] the history list's, JSON lists of text  ARGV[7] the estimate ('' = none)
-- ARGV[8] when it was archived (unix seconds)
-- Returns 'restored', or 'present' when Redis holds a record of the job.
if redis.call('EXISTS', KEYS[1]) == 1 then return 'present' end
local record = cjson.decode(ARGV[4])
for field, value in pairs(record) do redis.call('HSET', KEYS[1], field, value) end
redis.call('HSET', KEYS[1], 'archived_at', ARGV[8], 'archived_end', record['ended_at'] or '')
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
for _, entry in ipairs(cjson.decode(ARGV[5])) do redis.call('RPUSH', KEYS[2], entry) end
for _, entry in ipairs(cjson.decode(ARGV[6])) do redis.call('RPUSH', KEYS[3], entry) end
if ARGV[7] ~= '' then redis.call('SET', KEYS[4], ARGV[7]) end
keep_for(ARGV[3], KEYS[1], KEYS[2], KEYS[3], KEYS[4])
local state = record['state']
if state == 'failed' then
  redis.call('ZADD', KEYS[5], tonumber(record['ended_at'] or ARGV[2]), ARGV[1])
end
redis.call('ZADD', KEYS[6], tonumber(record['created_at'] or ARGV[2]), ARGV[1])
local left = redis.call('TTL', KEYS[6])
if left >= 0 and left < tonumber(ARGV[3]) then redis.call('EXPIRE', KEYS[6], ARGV[3]) end
index_state({KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11]}, KEYS[1], ARGV[1], state, ARGV[2], ARGV[3])
return 'restored'
