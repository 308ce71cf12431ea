-- KEYS: job leases items rq_job rq_started rejected_writes
-- heartbeat_v1: renew the lease, record progress (and optionally one item's result) and
-- mirror progress into RQ's job.meta, in one atomic step, for the attempt holding the token.
-- KEYS[1] job hash  KEYS[2] leases zset  KEYS[3] items hash  KEYS[4] rq job hash
-- KEYS[5] rq started registry  KEYS[6] rejected-writes counter
-- ARGV[1] job_id  ARGV[2] token  ARGV[3] now  ARGV[4] lease_seconds
-- ARGV[5] done ('' = count of stored items)  ARGV[6] total ('' = unchanged)
-- ARGV[7] item index ('' = none)  ARGV[8] item JSON  ARGV[9] rq started member ('' = none)
-- ARGV[10] renew ('1' extends the lease; '0' records progress only: an orphaned work-horse)
-- Returns {1, cancel_requested, done} or {0} when the token is superseded (zombie write).
if not holds_lease(KEYS[1], ARGV[2], KEYS[6]) then return {0} end
local now = tonumber(ARGV[3])
local expires = now + tonumber(ARGV[4])
if ARGV[10] == '0' then
  expires = tonumber(redis.call('HGET', KEYS[1], 'lease_expires_at') or ARGV[3])
end
if ARGV[7] ~= '' then
  redis.call('HSET', KEYS[3], ARGV[7], ARGV[8])
end
local done = ARGV[5]
if done == '' then
  done = tostring(redis.call('HLEN', KEYS[3]))
end
redis.call('HSET', KEYS[1], 'done', done, 'updated_at', ARGV[3], 'lease_expires_at', tostring(expires))
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[1], 'total', ARGV[6])
end
redis.call('ZADD', KEYS[2], expires, ARGV[1])
-- Keep RQ's own liveness in step with the lease, so RQ's abandoned-job sweep only ever
-- acts after leash's reaper would have (RQ adds 60 s of slack to its scores too).
if ARGV[9] ~= '' then
  redis.call('ZADD', KEYS[5], 'XX', expires + 60, ARGV[9])
end
-- Mirror progress into RQ's meta blob (JSON serializer) for rq-dashboard, keeping other keys.
local raw = redis.call('HGET', KEYS[4], 'meta')
local ok, meta = pcall(cjson.decode, raw or '{}')
if not ok or type(meta) ~= 'table' then meta = {} end
meta['leash_done'] = tonumber(done)
meta['leash_total'] = tonumber(redis.call('HGET', KEYS[1], 'total') or '0')
meta['leash_updated_at'] = now
redis.call('HSET', KEYS[4], 'meta', cjson.encode(meta))
local cancel = redis.call('HGET', KEYS[1], 'cancel_requested') or '0'
return {1, cancel, done}
