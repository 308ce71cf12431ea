-- KEYS: rq_job payload
-- compact_finished_rq_job_v1: RQ's record of a succeeded leash job, rewritten small. Run in
-- the same transaction as RQ's success bookkeeping (jobs/worker/rq_job.py), after RQ saved it.
-- While a job waits or runs, RQ's `data` holds the payload RQ hands the function; once it has
-- succeeded nothing runs it again (only failed jobs are requeued), and leash's own copy
-- (KEYS[2]) is what leash reads. So `data` becomes a stub RQ still reads (same function, the
-- kind, an empty payload) — but only while leash's copy exists: a job from a release that
-- kept no copy keeps RQ's. Fields RQ leaves empty go (RQ reads a missing one as empty), and
-- the meta mirror keeps the progress only (the kind and owner are in the description, the
-- last update is ended_at): a fixed ~40 bytes, whatever the kind's name. The hash is deleted
-- and written afresh (its expiry kept): Redis never turns a hash table back into a listpack,
-- and with every value within hash-max-listpack-value (64 bytes by default) the new one is a
-- listpack, without ~70 bytes of overhead per field.
-- KEYS[1] RQ's job hash  KEYS[2] leash's payload copy
-- ARGV[1] the stub `data`
-- Returns 1 if the payload went, 0 if RQ's copy was kept, -1 if there is no such job.
local fields = redis.call('HGETALL', KEYS[1])
if #fields == 0 then return -1 end
local ttl = redis.call('PTTL', KEYS[1])
local stubbed = 0
local kept = {}
for i = 1, #fields, 2 do
  local name, value = fields[i], fields[i + 1]
  if name == 'data' and redis.call('EXISTS', KEYS[2]) == 1 then
    value = ARGV[1]
    stubbed = 1
  elseif name == 'meta' then
    local ok, meta = pcall(cjson.decode, value)
    if ok and type(meta) == 'table' then
      meta['leash_kind'] = nil
      meta['leash_owner'] = nil
      meta['leash_updated_at'] = nil
      value = cjson.encode(meta)
    end
  end
  if value ~= '' then
    kept[#kept + 1] = name
    kept[#kept + 1] = value
  end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(kept))
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return stubbed
