-- KEYS: job reservations reservation_records
-- reservations_settle_v1: an attempt starts, or is about to end its job (finish, or fail): the
-- direct calls of the job whose reservations still stand -- an earlier attempt's work-horse
-- was SIGKILLed with calls in flight, which the provider may still answer and bill -- are
-- counted now as estimated calls (estimate_abandoned in _lib.lua: its input, the job's average
-- answer), their room in the budgets freed and the job never reading ended without them,
-- instead of when their deadlines pass minutes later. At the start the attempt has made no
-- call of its own; at its end its calls were settled by its item writes. A late write
-- of a call's real usage (a worker that held it through an outage) still replaces its estimate
-- (undo_estimate). Fenced: only the attempt holding the lease settles (a zombie's calls may be
-- another attempt's). A provider batch's reservation is left to its reads.
-- KEYS[1] the job hash  KEYS[2] the owner's reservations  KEYS[2] their records
-- ARGV[1] the attempt's token  ARGV[2] the job's reservation ids' prefix ("<job id>:")
-- ARGV[3] now (unix seconds)
-- Returns the number of calls counted, or -1 when the attempt does not hold the lease.
local lease = redis.call('HMGET', KEYS[1], 'state', 'token', 'in_flight_tokens')
if lease[1] ~= 'running' or lease[2] ~= ARGV[1] then return -1 end
if (tonumber(lease[3]) or 0) <= 0 then return 0 end  -- nothing of the job's reserved: no scan
local counted = 0
for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  if string.sub(id, 1, #ARGV[2]) == ARGV[2] then
    local raw = redis.call('HGET', KEYS[3], id)
    local r = raw and cjson.decode(raw)
    if r and r.i and r.job == KEYS[1] then
      release_reservation(KEYS[2], KEYS[3], id)
      estimate_abandoned(KEYS[2], KEYS[3], id, r, ARGV[3])
      counted = counted + 1
    end
  end
end
return counted
