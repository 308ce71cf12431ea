-- KEYS: job record rejected_writes
-- batch_note_v1: a fenced write to a batch job's record of its provider batches (jobs/batch/
-- run.py): what the attempt is about to create (before the create call), the batch
-- id the provider gave (after), a part read to its end. Only the attempt holding the lease
-- writes, so a zombie can neither record a batch nor hide one.
-- KEYS[1] job hash  KEYS[2] the job's batch record (hash)  KEYS[3] rejected-writes counter
-- ARGV[1] token  ARGV[2] seconds the record is kept ('' = leave its expiry: KEYS[2] may be the
-- job hash itself, for the counts a status read shows)  ARGV[3..] field, value, field, value ...
-- Returns 1 written, 0 superseded.
if not holds_lease(KEYS[1], ARGV[1], KEYS[3]) then return 0 end
for i = 3, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
if ARGV[2] ~= '' then redis.call('EXPIRE', KEYS[2], tonumber(ARGV[2])) end
return 1
