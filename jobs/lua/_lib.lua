-- Shared helpers, prepended to every script by jobs/core/lua.py (Redis scripts cannot import).
-- They take key names and values as arguments, never reading their caller's KEYS or ARGV, and
-- build no key name.

-- True when the job is running under this attempt's token; otherwise counts a refused write.
local function holds_lease(job_key, token, rejected_key)
  local fields = redis.call('HMGET', job_key, 'state', 'token')
  if fields[1] == 'running' and fields[2] == token then return true end
  redis.call('INCR', rejected_key)
  return false
end

-- Ended jobs keep their records for the result TTL ("come back next week"), no longer.
local function keep_for(ttl, ...)
  for _, key in ipairs({...}) do redis.call('EXPIRE', key, tonumber(ttl)) end
end

-- Count a terminal outcome: this minute's counters (for rate alerts) and the all-time total.
local function count_outcome(kind_minute_key, all_minute_key, totals_key, field, minute_ttl)
  for _, key in ipairs({kind_minute_key, all_minute_key}) do
    redis.call('INCR', key)
    redis.call('EXPIRE', key, tonumber(minute_ttl))
  end
  redis.call('HINCRBY', totals_key, field, 1)
end

-- Budget reservations (model_admit_v3): one per admitted model call or provider batch, in the
-- owner's sorted set by deadline (res_key) with its record in the owner's hash (records_key):
-- {job = job hash, day_key = owner's day hash, day = UTC day, t = tokens, n = nano-USD}. The job
-- hash's in_flight_tokens / in_flight_nusd and the day hash's reserved_tokens / reserved_nusd are
-- running sums of the live ones. The key names in a record were built by jobs/keys.py.

-- Take one reservation away from the sums it is counted in. Returns its record, or nil when it
-- was not there (settled or given back already: ZREM tells, so a repeat gives back nothing).
local function release_reservation(res_key, records_key, id)
  if redis.call('ZREM', res_key, id) == 0 then return nil end
  local raw = redis.call('HGET', records_key, id)
  redis.call('HDEL', records_key, id)
  if not raw then return nil end
  local r = cjson.decode(raw)
  for _, f in ipairs({{r.job, 'in_flight_tokens', r.t}, {r.job, 'in_flight_nusd', r.n},
                      {r.day_key, 'reserved_tokens', r.t}, {r.day_key, 'reserved_nusd', r.n}}) do
    local n = tonumber(f[3]) or 0
    -- Never recreate an expired hash; a sum never reads below zero.
    if n > 0 and redis.call('EXISTS', f[1]) == 1 and redis.call('HINCRBY', f[1], f[2], -n) < 0 then
      redis.call('HSET', f[1], f[2], 0)
    end
  end
  return r
end

-- A reservation made the way older releases reserved (one pool per job in the job hash, owned
-- by the attempt token reserved_by, on the UTC day reserved_day) is given back whole: to
-- day_key when that is its day. Called by the first admission or write that meets it.
local function drop_job_pool(job_key, day_key, day)
  local pool = redis.call('HMGET', job_key, 'reserved_by', 'reserved_day', 'reserved_tokens', 'reserved_nusd')
  if not pool[1] then return end
  if pool[2] == day and redis.call('EXISTS', day_key) == 1 then
    for _, f in ipairs({{'reserved_tokens', pool[3]}, {'reserved_nusd', pool[4]}}) do
      local n = tonumber(f[2]) or 0
      if n > 0 and redis.call('HINCRBY', day_key, f[1], -n) < 0 then redis.call('HSET', day_key, f[1], 0) end
    end
  end
  redis.call('HDEL', job_key, 'reserved_by', 'reserved_day', 'reserved_tokens', 'reserved_nusd')
end

-- A call leash abandoned (its work-horse killed, its write never made) was probably paid for:
-- when its reservation expires unsettled (model_admit_v3's records carry what it asked for: i
-- input tokens estimated, o output tokens at most, ni their input cost, n the worst cost, m the
-- model, k the kind, mk the model's totals key) it is counted as one estimated call -- its
-- input, and the job's average answer (at most o) -- on the job, the owner's day and the model.
-- A tombstone "est|<id>" (in the records, indexed in res_key for a day) remembers it, so that a
-- late write of the real usage (a worker that held it through an outage) replaces the estimate
-- instead of adding to it (undo_estimate).
local ESTIMATE_FIELDS = {{'calls', 'calls'}, {'input', 'input_tokens'}, {'output', 'output_tokens'},
  {'nusd', 'cost_nusd'}, {'unpriced', 'unpriced_calls'}, {'estimated', 'estimated_calls'}}

local function add_estimate(e, sign)
  local job_exists = redis.call('EXISTS', e.job) == 1
  for _, f in ipairs(ESTIMATE_FIELDS) do
    local n = (tonumber(e[f[1]]) or 0) * sign
    if n ~= 0 then
      if job_exists then redis.call('HINCRBY', e.job, 'usage_' .. f[2], n) end
      if redis.call('EXISTS', e.day_key) == 1 or sign > 0 then
        redis.call('HINCRBY', e.day_key, f[2], n)
        redis.call('HINCRBY', e.day_key, 'by|' .. e.m .. '|' .. e.k .. '|' .. f[2], n)
      end
      redis.call('HINCRBY', e.mk, f[2], n)
    end
  end
end

local function estimate_abandoned(res_key, records_key, id, r, now)
  local out = tonumber(r.o) or 0
  local seen = redis.call('HMGET', r.job, 'usage_calls', 'usage_output_tokens', 'usage_estimated_calls')
  local answered = (tonumber(seen[1]) or 0) - (tonumber(seen[3]) or 0)
  if answered > 0 then out = math.min(out, math.ceil((tonumber(seen[2]) or 0) / (tonumber(seen[1]) or 1))) end
  local worst, input_cost, max_out = tonumber(r.n) or 0, tonumber(r.ni) or 0, tonumber(r.o) or 0
  local nusd = input_cost
  if max_out > 0 then nusd = input_cost + math.floor((worst - input_cost) * out / max_out) end
  local e = {job = r.job, day_key = r.day_key, mk = r.mk, m = r.m, k = r.k, calls = 1, input = r.i, output = out,
    nusd = string.format('%d', nusd), unpriced = r.p == '0' and 1 or 0, estimated = 1}
  add_estimate(e, 1)
  redis.call('HSET', records_key, 'est|' .. id, cjson.encode(e))
  redis.call('ZADD', res_key, tonumber(now) + 86400, 'est|' .. id)
end

-- The real usage of a call counted as abandoned arrived: take the estimate back out.
local function undo_estimate(res_key, records_key, id)
  local raw = redis.call('HGET', records_key, 'est|' .. id)
  if not raw then return end
  redis.call('HDEL', records_key, 'est|' .. id)
  redis.call('ZREM', res_key, 'est|' .. id)
  add_estimate(cjson.decode(raw), -1)
end

-- Add one batch of model-call usage (cjson-decoded table ``u``: model, kind, calls, input,
-- output, cached, nusd, unpriced, estimated, and r: the ids of the reservations it settles) to
-- the job's totals, the attempt's, the owner's UTC day and the model's, and settle the
-- reservations it was sent under. Called by every write that carries usage; a call is counted
-- even when the write it came with is refused: it was paid for.
-- job_key: the job hash (totals); usage_key: per-attempt and per-item usage; day_key: the owner's
-- day the calls were admitted on (their reservations were held there); model_key: the model's
-- all-time totals; res_key, records_key: the owner's reservations (nil when the caller passes
-- none: the usage then settles only a pool in the job hash that this token holds, the way
-- older releases reserved). "hits" (requests answered from the request cache, at no cost) is
-- missing from an older worker's usage JSON, which is counted all the same.
local USAGE_FIELDS = {{'calls', 'calls'}, {'input', 'input_tokens'}, {'output', 'output_tokens'},
  {'cached', 'cached_input_tokens'}, {'nusd', 'cost_nusd'}, {'unpriced', 'unpriced_calls'},
  {'estimated', 'estimated_calls'}, {'hits', 'cache_hits'}}

local function add_usage(job_key, usage_key, day_key, model_key, u, token, day, attempt, ttl, day_ttl, res_key,
                         records_key)
  local job_exists = redis.call('EXISTS', job_key) == 1
  for _, f in ipairs(USAGE_FIELDS) do
    local n = tonumber(u[f[1]]) or 0
    if n ~= 0 then
      -- The job hash only while it exists: a late write must not recreate an expired job.
      if job_exists then redis.call('HINCRBY', job_key, 'usage_' .. f[2], n) end
      redis.call('HINCRBY', day_key, f[2], n)
      redis.call('HINCRBY', day_key, 'by|' .. u.model .. '|' .. u.kind .. '|' .. f[2], n)
      redis.call('HINCRBY', model_key, f[2], n)
    end
  end
  for _, f in ipairs({{'calls', 'calls'}, {'input', 'input_tokens'}, {'output', 'output_tokens'}}) do
    local n = tonumber(u[f[1]]) or 0
    if n ~= 0 then redis.call('HINCRBY', usage_key, 'a' .. attempt .. ':' .. f[2], n) end
  end
  redis.call('EXPIRE', usage_key, tonumber(ttl))
  redis.call('EXPIRE', day_key, tonumber(day_ttl))
  if res_key then
    -- Settle: each call's reservation (its worst case) goes; the real usage above took its place.
    if type(u.r) == 'table' then
      for _, id in ipairs(u.r) do
        if not release_reservation(res_key, records_key, id) then undo_estimate(res_key, records_key, id) end
      end
    end
    -- A pool an older release's worker left to this attempt (a batch it parked): given back.
    if job_exists and redis.call('HGET', job_key, 'reserved_by') == token then drop_job_pool(job_key, day_key, day) end
    return
  end
  -- No reservations given: the pool this attempt holds in the job hash gives back what these
  -- calls reserved; a pool left by a dead attempt is not ours.
  if job_exists and redis.call('HGET', job_key, 'reserved_by') == token then
    for _, f in ipairs({{'res_tokens', 'reserved_tokens'}, {'res_nusd', 'reserved_nusd'}}) do
      local n = tonumber(u[f[1]]) or 0
      if n > 0 then
        local left = redis.call('HINCRBY', job_key, f[2], -n)
        if left < 0 then redis.call('HSET', job_key, f[2], 0) end
        if redis.call('HGET', job_key, 'reserved_day') == day then
          left = redis.call('HINCRBY', day_key, f[2], -n)
          if left < 0 then redis.call('HSET', day_key, f[2], 0) end
        end
      end
    end
  end
end

-- add_usage, once per write: a worker whose reply was lost (a Redis blip, a failover) sends the
-- same write again, and its first try may have landed. The usage JSON's "w" is
-- "<thread>:<seq>": a thread of one claim (its token) sends its writes one at a time and its
-- seq only grows, so a seq at or below the last one counted for that thread and token was
-- counted already. The token, not the attempt number, tells claims apart: a hand-off or a
-- replay claims again under the same number, in a process whose thread ids may repeat. The
-- last seq is a field of the job's usage hash ("w<token>:<thread>", one per thread per claim)
-- and expires with it. A write without "w" is counted as add_usage counts.
local function add_usage_once(job_key, usage_key, day_key, model_key, u, token, day, attempt, ttl, day_ttl,
                               res_key, records_key)
  if type(u.w) == 'string' then
    local slot, seq = string.match(u.w, '^(%w+):(%d+)$')
    if slot then
      local field = 'w' .. token .. ':' .. slot
      if tonumber(seq) <= tonumber(redis.call('HGET', usage_key, field) or '0') then return end
      redis.call('HSET', usage_key, field, seq)
    end
  end
  add_usage(job_key, usage_key, day_key, model_key, u, token, day, attempt, ttl, day_ttl, res_key, records_key)
end

-- The model rate limit's clock: ARGV's now in ms, or Redis TIME (one clock for every worker).
local function now_ms(given)
  local now = tonumber(given)
  if now then return now end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A rate-limit bucket holds the next time (ms) it is free; the key lives a minute past it.
local function bucket_store(key, until_ms, now)
  redis.call('SET', key, string.format('%d', math.ceil(until_ms)), 'PX', math.max(1, math.ceil(until_ms - now)) + 60000)
end
local function bucket_read(key)
  return tonumber(redis.call('GET', key) or '0') or 0
end

-- Ask the model's shared rate limit for a request slot (GCRA: requests spread evenly).
-- Returns {0, w} slot reserved, start after w ms; {1, w} token budget spent, ask again after
-- w ms; {2, w} paused (429) for longer than max_wait, nothing reserved.
local function rate_acquire(requests_key, tokens_key, paused_key, now, per_request, per_token, max_wait)
  local paused = bucket_read(paused_key)
  if paused - now > max_wait then
    return {2, math.ceil(paused - now)}
  end
  local tokens_free_at = bucket_read(tokens_key)
  if per_token > 0 and tokens_free_at > now then
    return {1, math.ceil(tokens_free_at - now)}
  end
  local start = math.max(bucket_read(requests_key), now, paused)
  if per_request > 0 then
    bucket_store(requests_key, start + per_request, now)
  end
  return {0, math.ceil(start - now)}
end

-- Keep an owner's state indexes exact: the job is in the index of `state` and in no other.
-- `indexes` is the owner's five index keys in the order of jobs.keys.owner_state_indexes:
-- queued, running, succeeded, failed, expiries. An ended job's entry leaves with its records:
-- it is due in the expiries when they expire (`ttl` seconds from `now`), and an index holding
-- ended jobs lives at least that long, so no key or entry outlives the jobs it lists.
local INDEXED_STATES = {'queued', 'running', 'succeeded', 'failed'}
local function index_state(indexes, job_key, job_id, state, now, ttl)
  local created = tonumber(redis.call('HGET', job_key, 'created_at') or '') or tonumber(now)
  local expiries = indexes[5]
  for i, name in ipairs(INDEXED_STATES) do
    if name == state then
      redis.call('ZADD', indexes[i], created, job_id)
    else
      redis.call('ZREM', indexes[i], job_id)
    end
  end
  if state == 'succeeded' or state == 'failed' then
    ttl = tonumber(ttl)
    redis.call('ZADD', expiries, tonumber(now) + ttl, job_id)
    local index = indexes[3]
    if state == 'failed' then index = indexes[4] end
    for _, key in ipairs({index, expiries}) do
      if redis.call('TTL', key) < ttl then redis.call('EXPIRE', key, ttl) end
    end
  else
    redis.call('ZREM', expiries, job_id)
  end
end

-- The elements of `list` from position `first` to its end, as a list of their own.
local function tail(list, first)
  local out = {}
  for i = first, #list do out[#out + 1] = list[i] end
  return out
end

-- What a heartbeat records beyond the job hash: the reaper's index (leases), RQ's own liveness
-- kept in step with the lease (so RQ's abandoned-job sweep only ever acts after leash's reaper
-- would have; RQ adds 60 s of slack to its scores too), and progress mirrored into RQ's meta
-- blob (JSON serializer) for rq-dashboard, keeping its other keys. started_member '' = none.
-- Only into a record RQ still has: RQ's tools (rq-dashboard's Delete) can delete a running
-- job's record, and writing the mirror then would create a hash of a meta field alone, with
-- no expiry, that nothing removes if the worker dies before RQ's own bookkeeping rewrites it.
local function mirror_liveness(leases_key, started_key, rq_job_key, job_key, job_id, expires, started_member,
                               done, now)
  redis.call('ZADD', leases_key, expires, job_id)
  if started_member ~= '' then
    redis.call('ZADD', started_key, 'XX', expires + 60, started_member)
  end
  if redis.call('EXISTS', rq_job_key) == 0 then return end
  local raw = redis.call('HGET', rq_job_key, 'meta')
  local ok, meta = pcall(cjson.decode, raw or '{}')
  if not ok or type(meta) ~= 'table' then meta = {} end
  meta['leash_done'] = tonumber(done)
  meta['leash_total'] = tonumber(redis.call('HGET', job_key, 'total') or '0')
  meta['leash_updated_at'] = now
  redis.call('HSET', rq_job_key, 'meta', cjson.encode(meta))
end

-- Put a job at the FRONT of its RQ queue, its executions out of RQ's started registry (a
-- hand-off: another worker takes it next).
local function to_queue_front(started_key, executions_key, rq_job_key, queue_key, job_id, enqueued_at)
  for _, execution_id in ipairs(redis.call('ZRANGE', executions_key, 0, -1)) do
    redis.call('ZREM', started_key, job_id .. ':' .. execution_id)
  end
  redis.call('HSET', rq_job_key, 'status', 'queued', 'enqueued_at', enqueued_at)
  redis.call('LREM', queue_key, 0, job_id)
  redis.call('LPUSH', queue_key, job_id)
end

-- The queued cap (LEASH_MAX_QUEUED_PER_OWNER, door_take_v1, replay_v4): how many places of an
-- owner's cap are taken now: its queued jobs plus the holds of submissions still being written
-- (holds_key: job id -> when the hold lapses, Redis time). Lapsed holds are dropped first.
local function door_count(queued_key, holds_key)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  redis.call('ZREMRANGEBYSCORE', holds_key, '-inf', now)
  return redis.call('ZCARD', queued_key) + redis.call('ZCARD', holds_key), now
end

-- The request cache (jobs/models/cache.py): answers by request, each a string key with an
-- expiry, indexed by last use (index_key, a sorted set of entry key names) with its size in
-- bytes (sizes_key, a hash) and the sum of the sizes (total_key). The write that stores an
-- item stores its calls' answers here and refreshes the entries its hits used; it then drops
-- entries unused for longer than ttl and, while the sum is over the cap, the least recently
-- used: the cap is leash's own, never a Redis eviction policy.
-- cache_keys: index, sizes, total, then the n entries written, then the entries touched (to
-- its end). cache_args: ttl seconds (nil or '' = no cache write), cap in bytes, n, then each
-- written entry's value and size.
local CACHE_DROPS_PER_WRITE = 1000

local function cache_drop(index_key, sizes_key, total_key, names)
  for _, name in ipairs(names) do
    redis.call('DEL', name)
    redis.call('ZREM', index_key, name)
    local size = tonumber(redis.call('HGET', sizes_key, name) or '0') or 0
    redis.call('HDEL', sizes_key, name)
    if size ~= 0 and redis.call('DECRBY', total_key, size) < 0 then redis.call('SET', total_key, 0) end
  end
  return #names
end

local function cache_write(cache_keys, cache_args, now)
  if cache_args[1] == nil or cache_args[1] == '' then return end
  local index_key, sizes_key, total_key = cache_keys[1], cache_keys[2], cache_keys[3]
  local ttl, cap, n = tonumber(cache_args[1]), tonumber(cache_args[2]), tonumber(cache_args[3])
  now = tonumber(now)
  for i = 1, n do
    local name, value, size = cache_keys[3 + i], cache_args[2 + 2 * i], tonumber(cache_args[3 + 2 * i])
    if size <= cap then
      local old = tonumber(redis.call('HGET', sizes_key, name) or '0') or 0
      redis.call('SET', name, value, 'EX', math.ceil(ttl))
      redis.call('ZADD', index_key, now, name)
      redis.call('HSET', sizes_key, name, size)
      redis.call('INCRBY', total_key, size - old)
    end
  end
  for i = 4 + n, #cache_keys do
    if redis.call('EXPIRE', cache_keys[i], math.ceil(ttl)) == 1 then
      redis.call('ZADD', index_key, 'XX', now, cache_keys[i])
    end
  end
  local dropped = cache_drop(index_key, sizes_key, total_key,
    redis.call('ZRANGEBYSCORE', index_key, '-inf', now - ttl, 'LIMIT', 0, 100))
  while dropped < CACHE_DROPS_PER_WRITE and tonumber(redis.call('GET', total_key) or '0') > cap do
    local oldest = redis.call('ZRANGE', index_key, 0, 0)
    if #oldest == 0 then redis.call('SET', total_key, 0) break end
    dropped = dropped + cache_drop(index_key, sizes_key, total_key, oldest)
  end
end
