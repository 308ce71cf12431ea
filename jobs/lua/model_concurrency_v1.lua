-- KEYS: model_limit models
-- model_concurrency_v1: the adaptive (AIMD) concurrency limit shared by every job calling one
-- model. Each job runs at most `limit` calls to the model at once; an overload (429, timeout)
-- halves the limit for every job at once, and a window of clean answers raises it by one.
-- A burst of overloads from calls launched under the same limit halves it once: each call
-- carries the epoch it started in, and only an overload from the current epoch counts.
-- Growth is quick (a window of `limit` answers, about one round of calls), except for the one
-- step back to the level of the last overload, which waits `probe_rounds` rounds: the limit
-- spends its time just under what the server takes instead of sawing down from it, and past
-- that level (the server took more) it grows quickly again.
-- KEYS[1] the model's hash  KEYS[2] set of model names (for /metrics)
-- ARGV[1] op: 'read' | 'ok' | 'overload'
-- ARGV[2] the caller's ceiling (LEASH_ITEM_CONCURRENCY): start there, never grow past it
-- ARGV[3] the model's name (added to KEYS[2])
-- ARGV[4] overload: the epoch the call started in
-- ARGV[5] overload: the reason, '429' or 'timeout' (counted)
-- ARGV[6] probe rounds (windows of `limit` answers before growing past the last overload)
-- ARGV[7] seconds the hash lives after its last use
-- Returns {limit, epoch, version}: version counts changes of the limit, so a caller whose
-- replies arrive out of order (one per thread) keeps the newest.
local ceiling = tonumber(ARGV[2])
local limit = tonumber(redis.call('HGET', KEYS[1], 'limit') or '')
if not limit then
  limit = ceiling
  redis.call('HSET', KEYS[1], 'limit', limit, 'epoch', 0, 'clean', 0, 'overloaded_at', 0)
  redis.call('SADD', KEYS[2], ARGV[3])
end
local epoch = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0')

if ARGV[1] == 'ok' then
  redis.call('HINCRBY', KEYS[1], 'answers', 1)
  local clean = redis.call('HINCRBY', KEYS[1], 'clean', 1)
  local hurt_at = tonumber(redis.call('HGET', KEYS[1], 'overloaded_at') or '0')
  local window = limit
  if limit + 1 == hurt_at then
    window = limit * tonumber(ARGV[6])
  end
  if clean >= window and limit < ceiling then
    limit = limit + 1
    redis.call('HSET', KEYS[1], 'limit', limit, 'clean', 0)
    redis.call('HINCRBY', KEYS[1], 'version', 1)
  end
elseif ARGV[1] == 'overload' then
  redis.call('HINCRBY', KEYS[1], 'overloads_' .. ARGV[5], 1)
  if tonumber(ARGV[4]) == epoch then
    redis.call('HSET', KEYS[1], 'overloaded_at', limit)
    limit = math.ceil(limit / 2)
    epoch = epoch + 1
    redis.call('HSET', KEYS[1], 'limit', limit, 'epoch', epoch, 'clean', 0)
    redis.call('HINCRBY', KEYS[1], 'version', 1)
  end
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[7]))
return {limit, epoch, tonumber(redis.call('HGET', KEYS[1], 'version') or '0')}
