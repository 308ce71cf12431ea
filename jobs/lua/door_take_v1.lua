-- KEYS: queued door_holds
-- door_take_v1: check an owner's queued cap and take a place in it, in one step, for a job about
-- to be written (jobs/intake/door.py). The job's write removes the hold in the same transaction
-- that adds it to the queued index, so the count never drops in between; a writer that died
-- before writing leaves a hold that lapses after ARGV[2] seconds.
-- KEYS[1] the owner's queued index (zset)  KEYS[2] the owner's door holds (zset)
-- ARGV[1] job id  ARGV[2] seconds a hold lasts  ARGV[3] the cap
-- Returns {1, places taken before this one} when the place is taken, {0, places taken} when the
-- cap is reached. A job id that already holds a place keeps it (a retried write).
local count, now = door_count(KEYS[1], KEYS[2])
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return {1, count - 1}
end
if count >= tonumber(ARGV[3]) then
  return {0, count}
end
local lapses = now + tonumber(ARGV[2])
redis.call('ZADD', KEYS[2], lapses, ARGV[1])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[2]) * 1000 then
  redis.call('PEXPIRE', KEYS[2], math.ceil(tonumber(ARGV[2]) * 1000))
end
return {1, count}
