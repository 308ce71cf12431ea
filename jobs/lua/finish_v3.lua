-- KEYS: job leases items errors rejected_writes kind_minute all_minute totals payload queued running succeeded failed expiries
-- finish_v3: the attempt holding the token succeeded; record the small result summary. An
-- earlier attempt's error goes (its history stays in the errors list): a status answer shows
-- no error once succeeded, and the hash must hold the summary or an error, never both.
-- KEYS[1] job hash  KEYS[2] leases zset  KEYS[3] items hash  KEYS[4] errors list
-- KEYS[5] rejected-writes counter
-- KEYS[6] succeeded-this-minute counter for the kind  KEYS[7] same for all kinds
-- KEYS[8] all-time totals hash  KEYS[9] payload copy
-- KEYS[10..14] the owner's state indexes: queued, running, succeeded, failed zsets and
-- the expiries zset (jobs.keys.owner_state_indexes); the job moves between them here
-- ARGV[1] job_id  ARGV[2] token  ARGV[3] now  ARGV[4] result JSON  ARGV[5] ttl seconds
-- ARGV[6] totals field ("succeeded:<kind>")  ARGV[7] per-minute counter ttl
-- Returns 1, or 0 when the token is superseded (the write is refused).
if not holds_lease(KEYS[1], ARGV[2], KEYS[5]) then return 0 end
local done = redis.call('HLEN', KEYS[3])
if done == 0 then done = redis.call('HGET', KEYS[1], 'total') or '0' end
redis.call('HSET', KEYS[1], 'state', 'succeeded', 'result', ARGV[4], 'done', tostring(done),
  'updated_at', ARGV[3], 'ended_at', ARGV[3], 'lease_expires_at', '')
redis.call('HDEL', KEYS[1], 'error')
redis.call('ZREM', KEYS[2], ARGV[1])
keep_for(ARGV[5], KEYS[1], KEYS[3], KEYS[4], KEYS[9])
local owner_indexes = {KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14]}
index_state(owner_indexes, KEYS[1], ARGV[1], 'succeeded', ARGV[3], ARGV[5])
count_outcome(KEYS[6], KEYS[7], KEYS[8], ARGV[6], ARGV[7])
return 1
