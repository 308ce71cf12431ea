-- store_items_v1: many items' results in one fenced write, for a batch job storing the answers
-- of its provider batch (jobs/batch/run.py). What heartbeat_v2 does for one item, done
-- for each (the item's result, its calls and tokens), then once for all: the usage of their calls
-- added to the job, the attempt, the owner's day and the model (counted even when the write is
-- refused: the calls were paid for; once, even when a lost reply made the worker send the
-- write again: see add_usage_once), the lease renewed, progress recorded and mirrored into
-- RQ's job.meta for rq-dashboard.
-- KEYS[1] job hash  KEYS[2] leases zset  KEYS[3] items hash  KEYS[4] rq job hash
-- KEYS[5] rq started registry  KEYS[6] rejected-writes counter
-- KEYS[7] job usage hash (per attempt, per item)  KEYS[8] owner's usage for the UTC day
-- KEYS[9] the model's usage totals  KEYS[10] the owner's reservations (by deadline)
-- KEYS[11] their records (the usage JSON's "r" names the ones this write settles)
-- ARGV[1] job_id  ARGV[2] token  ARGV[3] now  ARGV[4] lease_seconds  ARGV[5] rq started member
-- ('' = none)  ARGV[6] renew ('1' extends the lease; '0': an orphaned work-horse)
-- ARGV[7] usage JSON of all the items' calls ('' = none; see add_usage_once)  ARGV[8] the UTC
-- day they were reserved on, which KEYS[8] is
-- ARGV[9] attempt number  ARGV[10] usage hash ttl  ARGV[11] owner day ttl
-- ARGV[12..] per item: index, result JSON, "calls,input,output" ('' = none)
-- Returns {1, cancel_requested, done} or {0} when the token is superseded (zombie write).
if ARGV[7] ~= '' then
  add_usage_once(KEYS[1], KEYS[7], KEYS[8], KEYS[9], cjson.decode(ARGV[7]), ARGV[2], ARGV[8], ARGV[9], ARGV[10], ARGV[11],
    KEYS[10], KEYS[11])
end
if not holds_lease(KEYS[1], ARGV[2], KEYS[6]) then return {0} end
for i = 12, #ARGV, 3 do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  if ARGV[i + 2] ~= '' then redis.call('HSET', KEYS[7], 'i' .. ARGV[i], ARGV[i + 2]) end
end
local now = tonumber(ARGV[3])
local expires = now + tonumber(ARGV[4])
if ARGV[6] == '0' then
  expires = tonumber(redis.call('HGET', KEYS[1], 'lease_expires_at') or ARGV[3])
end
local done = tostring(redis.call('HLEN', KEYS[3]))
redis.call('HSET', KEYS[1], 'done', done, 'updated_at', ARGV[3], 'lease_expires_at', tostring(expires))
mirror_liveness(KEYS[2], KEYS[5], KEYS[4], KEYS[1], ARGV[1], expires, ARGV[5], done, now)
return {1, redis.call('HGET', KEYS[1], 'cancel_requested') or '0', done}
