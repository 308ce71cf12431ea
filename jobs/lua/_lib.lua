-- Shared helpers, prepended to every script by jobs/scripts.py (Redis scripts cannot import).
-- They take key names as arguments: no key name is ever built in Lua.

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
