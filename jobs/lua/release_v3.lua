-- KEYS: job leases rq_job rq_queue rq_started rq_executions rejected_writes history queued running succeeded failed expiries
-- release_v3: give the job back without counting the attempt. Deploy hand-off (requeue=1):
-- to the FRONT of its RQ queue at once. Deferral (requeue=0, e.g. the model said 429 with
-- Retry-After): leash marks it queued and the caller lets RQ's scheduler bring it back later.
-- A look at a waiting batch (claim_v4) given back was never an attempt, so nothing is
-- uncounted and no history entry is written; the job is parked again, due at once, and goes
-- to the FRONT of its RQ queue like any hand-off (a deferral: RQ's scheduler brings it back).
-- KEYS[1] job hash  KEYS[2] leases zset  KEYS[3] rq job hash  KEYS[4] rq queue list
-- KEYS[5] rq started registry  KEYS[6] rq executions zset  KEYS[7] rejected-writes counter
-- KEYS[8] attempt history list (records how this attempt ended)
-- KEYS[9..13] the owner's state indexes: queued, running, succeeded, failed zsets and
-- the expiries zset (jobs.keys.owner_state_indexes); the job moves between them here
-- ARGV[1] job_id  ARGV[2] token  ARGV[3] now  ARGV[4] enqueued_at (RQ's format)
-- ARGV[5] requeue ('1' hand-off to the queue front, '0' deferral)
-- ARGV[6] grace (seconds) a look given back may take before the job reads as stale
-- Returns 1 (hand-off) or the job's deferral count (deferral); 0 when the token is superseded.
if not holds_lease(KEYS[1], ARGV[2], KEYS[7]) then return 0 end
if redis.call('HGET', KEYS[1], 'phase') == 'looking' then
  redis.call('HSET', KEYS[1], 'phase', 'waiting', 'look_at', ARGV[3], 'updated_at', ARGV[3],
    'lease_expires_at', tostring(tonumber(ARGV[3]) + tonumber(ARGV[6])))
  redis.call('HDEL', KEYS[1], 'looking_worker')
  redis.call('ZREM', KEYS[2], ARGV[1])
  if ARGV[5] == '0' then
    return redis.call('HINCRBY', KEYS[1], 'defers', 1)  -- the caller's Retry brings it back
  end
  redis.call('HINCRBY', KEYS[1], 'handoffs', 1)
  to_queue_front(KEYS[5], KEYS[6], KEYS[3], KEYS[4], ARGV[1], ARGV[4])
  return 1
end
local attempt = redis.call('HINCRBY', KEYS[1], 'attempts', -1) + 1
local ended = 'deferred'
if ARGV[5] == '1' then ended = 'handed off' end
redis.call('RPUSH', KEYS[8], cjson.encode({attempt = attempt, at = ARGV[3], ended = ended}))
redis.call('HSET', KEYS[1], 'state', 'queued', 'updated_at', ARGV[3], 'lease_expires_at', '')
redis.call('ZREM', KEYS[2], ARGV[1])
local owner_indexes = {KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13]}
index_state(owner_indexes, KEYS[1], ARGV[1], 'queued', ARGV[3], 0)
if ARGV[5] == '0' then
  return redis.call('HINCRBY', KEYS[1], 'defers', 1)
end
redis.call('HINCRBY', KEYS[1], 'handoffs', 1)
to_queue_front(KEYS[5], KEYS[6], KEYS[3], KEYS[4], ARGV[1], ARGV[4])
return 1
