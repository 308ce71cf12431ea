-- KEYS: failed_index active per_job...
-- replay_v4: put a batch of failed jobs back to queued, attempts 0, in one atomic step per
-- job. Checkpoints (items) and the error history stay; the TTLs set when the job failed are
-- removed. RQ's side is made consistent: out of its failed registry, retries restored, and
-- either waiting for a slot of its rate limit (RQ promotes it: the caller then runs RQ's
-- acquire step for each rate-limit key) or, for a job without a rate limit, on its queue.
-- The budget a replay may set is written in the same step onto the jobs it replays only: a job
-- skipped because it is no longer failed (running again, succeeded) keeps the budget it runs
-- under. Each flip counts against the owner's queued cap (LEASH_MAX_QUEUED_PER_OWNER) in the
-- same step: a job whose owner has as many jobs queued (and places held by submissions being
-- written, door_take_v1) as the cap stays failed and is answered 'over-cap:<places taken>'.
-- KEYS[1] failed index zset
-- KEYS[2] active index zset
-- then, per job in ARGV order: job hash, items hash, errors list, payload copy, rq job hash,
--   rq failed registry zset, destination (mode 'limited': the rate limit's waiting zset;
--   mode 'list': the rq queue list), the owner's state indexes (queued, running, succeeded,
--   failed zsets and the expiries zset: jobs.keys.owner_state_indexes), the owner's door holds
--   (jobs.keys.owner_door_holds), and in mode 'limited' only: the rate limit's allowed zset
-- ARGV[1] now (unix seconds)  ARGV[2] enqueued_at (RQ's format)
-- ARGV[3] position of this batch's first job in the whole replay (keeps the waiting order)
-- ARGV[4] the budget's job-hash fields as a JSON object ('' = the jobs keep theirs)
-- ARGV[5] the queued cap ('' = none)
-- ARGV[6..] per job: job_id, mode ('limited' | 'list'), reopen ('' or a JSON list of the
--   indexes of its items that ended in an error: `leash replay --errored-items`)
-- A job given its errored items is reopened in the same step as its flip, and only if it flips:
-- those items' results leave its items hash (the answered ones stay, and cost nothing again),
-- its done count follows, and a job that succeeded with item errors is taken too (its result
-- summary dropped). Refused (the cap, RQ's record gone, no longer ended) it is left as it was.
-- Returns one entry per job: 'replayed', the state it was in ('running', 'succeeded', ...),
-- 'missing' (no job hash), 'rq-missing' (RQ's job hash expired: nothing to run) or
-- 'over-cap:<n>' (left failed: the owner's n places of the cap are taken).
local now = ARGV[1]
local out = {}
local k = 3
local position = tonumber(ARGV[3])
local budget = nil
if ARGV[4] ~= '' then budget = cjson.decode(ARGV[4]) end
local cap = nil
if ARGV[5] ~= '' then cap = tonumber(ARGV[5]) end
local taken = 0
local function full(queued_key, holds_key)
  taken = door_count(queued_key, holds_key)
  return taken >= cap
end
for a = 6, #ARGV, 3 do
  local job_id, mode = ARGV[a], ARGV[a + 1]
  local reopen = nil
  if ARGV[a + 2] ~= '' then reopen = cjson.decode(ARGV[a + 2]) end
  local job, items, errors, payload = KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  local rq_job, rq_failed, dest = KEYS[k + 4], KEYS[k + 5], KEYS[k + 6]
  local allowed = nil
  local indexes = {KEYS[k + 7], KEYS[k + 8], KEYS[k + 9], KEYS[k + 10], KEYS[k + 11]}
  local holds = KEYS[k + 12]
  k = k + 13
  if mode == 'limited' then
    allowed = KEYS[k]
    k = k + 1
  end
  local fields = redis.call('HMGET', job, 'state', 'max_attempts')
  local state = fields[1]
  if not state then
    out[#out + 1] = 'missing'
  elseif state ~= 'failed' and not (reopen and state == 'succeeded') then
    out[#out + 1] = state
  elseif redis.call('EXISTS', rq_job) == 0 then
    out[#out + 1] = 'rq-missing'
  elseif cap and full(indexes[1], holds) then
    out[#out + 1] = 'over-cap:' .. taken
  else
    local max_attempts = tonumber(fields[2] or '1')
    if reopen then
      for _, index in ipairs(reopen) do redis.call('HDEL', items, tostring(index)) end
      redis.call('HSET', job, 'done', tostring(redis.call('HLEN', items)), 'item_errors', '0')
      redis.call('HDEL', job, 'result')
    end
    redis.call('HSET', job, 'state', 'queued', 'attempts', '0', 'updated_at', now,
      'lease_expires_at', '', 'cancel_requested', '0')
    redis.call('HDEL', job, 'ended_at')
    redis.call('HINCRBY', job, 'replays', 1)
    if budget then
      for field, value in pairs(budget) do redis.call('HSET', job, field, tostring(value)) end
    end
    redis.call('PERSIST', job)
    redis.call('PERSIST', items)
    redis.call('PERSIST', errors)
    redis.call('PERSIST', payload)
    redis.call('ZREM', KEYS[1], job_id)
    redis.call('ZADD', KEYS[2], tonumber(now), job_id)
    index_state(indexes, job, job_id, 'queued', now, 0)

    redis.call('HSET', rq_job, 'retries_left', tostring(math.max(0, max_attempts - 1)),
      'started_at', '', 'ended_at', '')
    redis.call('HDEL', rq_job, 'exc_info')
    redis.call('PERSIST', rq_job)
    redis.call('ZREM', rq_failed, job_id)
    if mode == 'limited' then
      -- A failed job holds no slot; drop a leaked one so it cannot count twice.
      redis.call('ZREM', allowed, job_id)
      redis.call('HSET', rq_job, 'status', 'rate_limited')
      -- RQ promotes waiting jobs oldest first: a microsecond apart keeps the selection order.
      redis.call('ZADD', dest, tonumber(now) + position * 0.000001, job_id)
    else
      redis.call('HSET', rq_job, 'status', 'queued', 'enqueued_at', ARGV[2])
      redis.call('RPUSH', dest, job_id)
    end
    out[#out + 1] = 'replayed'
  end
  position = position + 1
end
return out
