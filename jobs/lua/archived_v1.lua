-- KEYS: job heavy...
-- archived_v1: a job the archive (jobs/archive/) now holds whole lets its heavy keys go after
-- the keep time. Its small record stays as long as before (status, lists, failure groups and
-- alerts read it), marked with when it was archived and which ending was archived, so reads of
-- its items go to the archive once Redis' copy has left and a second archive of the same
-- ending is skipped. A key keeps a shorter expiry it already has. Nothing happens to a job
-- that has no record, or whose ending is no longer the one archived (a replay ran since).
-- KEYS[1] job hash  KEYS[2..] its items, answers, usage, payload and RQ's keys (jobs.keys.archived_heavy)
-- ARGV[1] the keep time in seconds (LEASH_REDIS_KEEP)  ARGV[2] when it was archived (unix seconds)
-- ARGV[3] the ending archived (the record's ended_at as read before the write)
-- Returns how many keys got the keep time, or -1 when nothing was done.
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if (redis.call('HGET', KEYS[1], 'ended_at') or '') ~= ARGV[3] then return -1 end
redis.call('HSET', KEYS[1], 'archived_at', ARGV[2], 'archived_end', ARGV[3])
local keep = math.max(tonumber(ARGV[1]) * 1000, 1)
local changed = 0
for i = 2, #KEYS do
  local left = redis.call('PTTL', KEYS[i])
  if left == -1 or left > keep then
    redis.call('PEXPIRE', KEYS[i], keep)
    changed = changed + 1
  end
end
return changed
