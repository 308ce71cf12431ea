-- KEYS: failed_index jobs...
-- failure_heads_v1: for a batch of ids from the failed index, when each failed, its kind and
-- the first line of its stored error (cut to ARGV[1] characters), as one string per job.
-- Only the head crosses the network: the error field holds up to several KB of traceback,
-- and reading it whole for 100,000 jobs would move hundreds of MB. One joined string per job
-- keeps the client's reply parsing to one element per job. Ids whose job hash has expired,
-- or that are no longer failed, are removed from the index as they are met (the index
-- itself has no TTL).
-- KEYS[1] failed index zset  KEYS[2..n+1] job hashes
-- ARGV[1] max characters of the head  ARGV[2] length of the job-hash key prefix (the id is
-- the rest of the key: passing the ids again would double what the client sends)
-- Returns one entry per id: "<failed_at>\t<kind>\t<head>", or false for a pruned id.
local limit = tonumber(ARGV[1])
local id_from = tonumber(ARGV[2]) + 1
local out = {}
for i = 2, #KEYS do
  local job_id = string.sub(KEYS[i], id_from)
  local fields = redis.call('HMGET', KEYS[i], 'state', 'kind', 'error')
  if fields[1] ~= 'failed' then
    redis.call('ZREM', KEYS[1], job_id)
    out[#out + 1] = false
  else
    local err = fields[3] or ''
    local cut = string.find(err, '\n', 1, true)
    if cut == nil or cut > limit + 1 then cut = limit + 1 end
    local failed_at = redis.call('ZSCORE', KEYS[1], job_id) or ''
    out[#out + 1] = failed_at .. '\t' .. (fields[2] or '') .. '\t' .. string.sub(err, 1, cut - 1)
  end
end
return out
