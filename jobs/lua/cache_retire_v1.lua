-- KEYS: index sizes total entries...
-- cache_retire_v1: request-cache entries the archive now holds (jobs/archive/answers.py) leave
-- Redis, as the cache's own cap drops an entry (cache_drop): the entry, its place in the index,
-- its size. Only an entry whose last use is still at most the newest one copied: an entry a hit
-- used since (a later score) stays, and is copied again once it is unused for the keep time.
-- KEYS[1] the cache's index  KEYS[2] its sizes  KEYS[3] its total  KEYS[4..] the entries copied
-- ARGV[1] the newest last use copied (an index score)
-- Returns how many entries left Redis.
local newest = tonumber(ARGV[1])
local gone = {}
for i = 4, #KEYS do
  local score = redis.call('ZSCORE', KEYS[1], KEYS[i])
  if score and tonumber(score) <= newest then table.insert(gone, KEYS[i]) end
end
return cache_drop(KEYS[1], KEYS[2], KEYS[3], gone)
