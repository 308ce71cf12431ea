-- KEYS: reservation_owners reservations reservation_records
-- reservations_sweep_v1: the reaper's turn at an owner's reservations whose deadlines passed,
-- for an owner who makes no more calls (model_admit_v3 does the same at each admission): each
-- is a call that can no longer be paid for; a direct call's is counted as an estimated call
-- (estimate_abandoned in _lib.lua), a provider batch's given back. Then the owner's place in
-- the index moves to its next deadline, or leaves it when it holds none.
-- KEYS[1] owners with reservations (by earliest deadline)  KEYS[2] the owner's reservations
-- KEYS[3] their records
-- ARGV[1] now (unix seconds)  ARGV[2] the owner  ARGV[3] most reservations given back here
-- Returns the number given back.
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(expired) do
  local r = release_reservation(KEYS[2], KEYS[3], id)
  if r and r.i then estimate_abandoned(KEYS[2], KEYS[3], id, r, ARGV[1]) end
end
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if first[2] then
  redis.call('ZADD', KEYS[1], first[2], ARGV[2])
else
  redis.call('ZREM', KEYS[1], ARGV[2])
end
return #expired
