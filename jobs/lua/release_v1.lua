-- KEYS: job leases rq_job rq_queue rq_started rq_executions rejected_writes history
-- release_v1: give the job back without counting the attempt. Deploy hand-off (requeue=1):
-- to the FRONT of its RQ queue at once. Deferral (requeue=0, e.g. the model said 429 with
-- Retry-After): leash marks it queued and the caller lets RQ's scheduler bring it back later.
-- KEYS[1] job hash  KEYS[2] leases zset  KEYS[3] rq job hash  KEYS[4] rq queue list
-- KEYS[5] rq started registry  KEYS[6] rq executions zset  KEYS[7] rejected-writes counter
-- KEYS[8] attempt history list (records how this attempt ended)
-- ARGV[1] job_id  ARGV[2] token  ARGV[3] now  ARGV[4] enqueued_at (RQ's format)
-- ARGV[5] requeue ('1' hand-off to the queue front, '0' deferral)
-- Returns 1 (hand-off) or the job's deferral count (deferral); 0 when the token is superseded.
if not holds_lease(KEYS[1], ARGV[2], KEYS[7]) then return 0 end
local attempt = redis.call('HINCRBY', KEYS[1], 'attempts', -1) + 1
local ended = 'deferred'
if ARGV[5] == '1' then ended = 'handed off' end
redis.call('RPUSH', KEYS[8], cjson.encode({attempt = attempt, at = ARGV[3], ended = ended}))
redis.call('HSET', KEYS[1], 'state', 'queued', 'updated_at', ARGV[3], 'lease_expires_at', '')
redis.call('ZREM', KEYS[2], ARGV[1])
if ARGV[5] == '0' then
  return redis.call('HINCRBY', KEYS[1], 'defers', 1)
end
redis.call('HINCRBY', KEYS[1], 'handoffs', 1)
for _, execution_id in ipairs(redis.call('ZRANGE', KEYS[6], 0, -1)) do
  redis.call('ZREM', KEYS[5], ARGV[1] .. ':' .. execution_id)
end
redis.call('HSET', KEYS[3], 'status', 'queued', 'enqueued_at', ARGV[4])
redis.call('LREM', KEYS[4], 0, ARGV[1])
redis.call('LPUSH', KEYS[4], ARGV[1])
return 1
