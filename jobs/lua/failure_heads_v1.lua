-- failure_heads_v1: for a batch of ids from the failed index, the kind and the first line of
-- the stored error (cut to ARGV[1] characters). Only the head crosses the network: the error
-- field holds up to several KB of traceback, and reading it whole for 100,000 jobs would move
-- hundreds of MB. Ids whose job hash has expired, or that are no longer failed, are removed
-- from the index as they are met (the index itself has no TTL).
-- KEYS[1] failed index zset  KEYS[2..n+1] job hashes
-- ARGV[1] max characters of the head  ARGV[2..n+1] job ids (same order as the hashes)
-- Returns a flat list {kind, head, kind, head, ...}; both false for a pruned id.
local limit = tonumber(ARGV[1])
local out = {}
for i = 2, #KEYS do
  local fields = redis.call('HMGET', KEYS[i], 'state', 'kind', 'error')
  if fields[1] ~= 'failed' then
    redis.call('ZREM', KEYS[1], ARGV[i])
    out[#out + 1] = false
    out[#out + 1] = false
  else
    local err = fields[3] or ''
    local cut = string.find(err, '\n', 1, true)
    if cut == nil or cut > limit + 1 then cut = limit + 1 end
    out[#out + 1] = fields[2] or ''
    out[#out + 1] = string.sub(err, 1, cut - 1)
  end
end
return out
