-- KEYS: job leases rejected_writes batch_looks
-- park_v1: a batch job gives its worker back while the provider works. The job stays
-- `running` (its attempt goes on at the provider) in the phase `waiting`: it leaves the
-- leases (no worker renews it, the reaper leaves it alone), its `lease_expires_at` becomes
-- the time leash looks next plus a grace (status: stale only if that look did not happen),
-- and the fencing token moves on, so nothing the parking attempt might still send lands.
-- The caller lets RQ's scheduler bring the job back at `look_at` (claim_v4 then hands out a
-- look, not an attempt). Refused when a cancel was asked for: the caller stops instead.
-- KEYS[1] job hash  KEYS[2] leases zset  KEYS[3] rejected-writes counter
-- KEYS[4] the waiting batch jobs by when their look is overdue (the sweep puts back a look RQ lost)
-- ARGV[1] job_id  ARGV[2] token  ARGV[3] now  ARGV[4] next look (unix seconds)
-- ARGV[5] grace (seconds)  ARGV[6] requests done at the provider  ARGV[7] failed there
-- ARGV[8] requests sent  ARGV[9] batches at the provider ('' for any of ARGV[6..8]: as it was)
-- ARGV[10] the stage at the provider: 'waiting', or 'canceling' (its batch canceled past the
-- longest wait, read once it ends; the phase stays 'waiting' for claim and cancel)
-- ARGV[11] looks in a row the provider did not answer
-- Returns 1 parked, 2 a cancel was asked for (nothing changed), 0 superseded.
if not holds_lease(KEYS[1], ARGV[2], KEYS[3]) then return 0 end
if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then return 2 end
-- Tokens are integers near 2^51 (claim_v4): written with '%d', as tostring would round them.
local token = string.format('%d', redis.call('HINCRBY', KEYS[1], 'token', 1))
if redis.call('HGET', KEYS[1], 'reserved_by') == ARGV[2] then
  redis.call('HSET', KEYS[1], 'reserved_by', token)
end
local overdue_at = tonumber(ARGV[4]) + tonumber(ARGV[5])
redis.call('HSET', KEYS[1], 'phase', 'waiting', 'look_at', ARGV[4], 'updated_at', ARGV[3],
  'lease_expires_at', tostring(overdue_at), 'batches', ARGV[9],
  'batch_stage', ARGV[10] or 'waiting', 'batch_failed_looks', ARGV[11] or '0')
for i, field in ipairs({'batch_done', 'batch_failed', 'batch_total'}) do
  if ARGV[5 + i] ~= '' then redis.call('HSET', KEYS[1], field, ARGV[5 + i]) end
end
redis.call('HDEL', KEYS[1], 'looking_worker')
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[4], overdue_at, ARGV[1])
return 1
