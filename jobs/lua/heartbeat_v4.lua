-- KEYS: job leases items rq_job rq_started rejected_writes usage owner_day model_usage reservations reservation_records cache_index cache_sizes cache_bytes cache_entries...
-- heartbeat_v4: renew the lease, record progress (and optionally one item's result, with the
-- usage of the model calls behind it) and mirror progress into RQ's job.meta, in one atomic
-- step, for the attempt holding the token; and write the request cache with the item
-- (cache_write in _lib.lua): the answers of the item's calls stored, the entries its cache
-- hits used refreshed, old and over-the-cap entries dropped -- no round trip of its own.
-- Usage and answers are kept even when the write is refused (the calls were paid for), and
-- usage is counted once even when the write is sent twice: a worker that lost the reply to
-- its first try (a Redis blip, a failover) sends the same write again, and the usage JSON's
-- "w" names it (add_usage_once). An item's usage is stored as "calls,input,output,hits".
-- KEYS[1] job hash  KEYS[2] leases zset  KEYS[3] items hash  KEYS[4] rq job hash
-- KEYS[5] rq started registry  KEYS[6] rejected-writes counter
-- KEYS[7] job usage hash (per attempt, per item)  KEYS[8] owner's usage for the UTC day
-- KEYS[9] the model's usage totals  KEYS[10] the owner's reservations (by deadline)
-- KEYS[11] their records (the usage JSON's "r" names the ones this write settles)
-- KEYS[12..14] the cache's index, sizes and total; KEYS[15..] cache entries written, then touched
-- ARGV[1] job_id  ARGV[2] token  ARGV[3] now  ARGV[4] lease_seconds
-- ARGV[5] done ('' = count of stored items)  ARGV[6] total ('' = unchanged)
-- ARGV[7] item index ('' = none)  ARGV[8] item JSON  ARGV[9] rq started member ('' = none)
-- ARGV[10] renew ('1' extends the lease; '0' records progress only: an orphaned work-horse)
-- ARGV[11] usage JSON ('' = none; see add_usage_once)  ARGV[12] the UTC day (YYYY-MM-DD) its
-- calls were admitted on, which KEYS[8] is
-- ARGV[13] attempt number  ARGV[14] usage hash ttl  ARGV[15] owner day ttl
-- ARGV[16] cache ttl ('' = no cache write)  ARGV[17] cache cap (bytes)  ARGV[18] entries written
-- ARGV[19..] each entry's value and size
-- Returns {1, cancel_requested, done} or {0} when the token is superseded (zombie write).
local usage = nil
if ARGV[11] ~= '' then
  usage = cjson.decode(ARGV[11])
  add_usage_once(KEYS[1], KEYS[7], KEYS[8], KEYS[9], usage, ARGV[2], ARGV[12], ARGV[13], ARGV[14], ARGV[15],
    KEYS[10], KEYS[11])
end
-- Answers were paid for whoever stores the item: they are cached even when the write is refused.
cache_write(tail(KEYS, 12), tail(ARGV, 16), ARGV[3])
if not holds_lease(KEYS[1], ARGV[2], KEYS[6]) then return {0} end
local now = tonumber(ARGV[3])
local expires = now + tonumber(ARGV[4])
if ARGV[10] == '0' then
  expires = tonumber(redis.call('HGET', KEYS[1], 'lease_expires_at') or ARGV[3])
end
if ARGV[7] ~= '' then
  redis.call('HSET', KEYS[3], ARGV[7], ARGV[8])
  if usage ~= nil then
    -- What this item cost: calls, input and output tokens (downloads show them).
    redis.call('HSET', KEYS[7], 'i' .. ARGV[7],
      string.format('%d,%d,%d,%d', tonumber(usage.calls) or 0, tonumber(usage.input) or 0,
        tonumber(usage.output) or 0, tonumber(usage.hits) or 0))
  end
end
local done = ARGV[5]
if done == '' then
  done = tostring(redis.call('HLEN', KEYS[3]))
end
redis.call('HSET', KEYS[1], 'done', done, 'updated_at', ARGV[3], 'lease_expires_at', tostring(expires))
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[1], 'total', ARGV[6])
end
mirror_liveness(KEYS[2], KEYS[5], KEYS[4], KEYS[1], ARGV[1], expires, ARGV[9], done, now)
local cancel = redis.call('HGET', KEYS[1], 'cancel_requested') or '0'
return {1, cancel, done}
