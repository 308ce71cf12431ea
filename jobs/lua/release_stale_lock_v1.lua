-- KEYS: lock
-- release_stale_lock_v1: delete a lock only if the holder we judged dead still holds it
-- (compare-and-delete: a lock that changed hands meanwhile is left alone).
-- KEYS[1] lock key
-- ARGV[1] the holder judged dead
-- Returns 1 if the lock was deleted, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
