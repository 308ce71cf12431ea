-- KEYS: job retained...
-- retain_v1: the one retention rule. Once a job has ended its record (the job hash) carries
-- its expiry; every other key of the job, leash's and RQ's (RQ's record holds the submitted
-- items), expires no later than the record: a key without an expiry, or with a longer one
-- (the attempt history kept past the last claim, the usage hash past its last write), gets
-- the record's remaining time. Nothing happens while the job runs or waits (no expiry on the
-- record) or once the record is gone.
-- KEYS[1] job hash  KEYS[2..] the job's other keys (jobs.keys.retained_with_job)
-- ARGV[1] the retention in seconds (LEASH_RESULT_TTL): no key keeps more, even when the
-- record was given a longer expiry under a longer setting
-- Returns how many keys got the record's expiry.
local ttl = redis.call('PTTL', KEYS[1])
if ttl <= 0 then return 0 end
ttl = math.min(ttl, tonumber(ARGV[1]) * 1000)
local changed = 0
for i = 2, #KEYS do
  local left = redis.call('PTTL', KEYS[i])
  if left == -1 or left > ttl then
    redis.call('PEXPIRE', KEYS[i], ttl)
    changed = changed + 1
  end
end
return changed
