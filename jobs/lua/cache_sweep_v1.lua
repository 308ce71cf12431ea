-- KEYS: cache_index cache_sizes cache_bytes
-- cache_sweep_v1: the request cache's entries whose last use is older than the cache's TTL have
-- expired; drop them from its index, sizes and byte total (cache_drop in _lib.lua), as a cache
-- write does for the first hundred it meets. Run by the workers' periodic sweep, so a cache
-- nobody writes to any more does not keep counting answers Redis no longer holds.
-- KEYS[1] the cache's index (key name -> last use)  KEYS[2] each entry's size  KEYS[3] their sum
-- ARGV[1] now (unix seconds)  ARGV[2] the cache's TTL (seconds)  ARGV[3] most entries dropped here
-- Returns the number dropped.
return cache_drop(KEYS[1], KEYS[2], KEYS[3],
  redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[1]) - tonumber(ARGV[2]), 'LIMIT', 0, tonumber(ARGV[3])))
