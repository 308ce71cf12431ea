-- KEYS: sessions expiries owners
-- session_start_v1: a browser signs in. Its session joins its owner's, the owner's lapsed
-- sessions leave, and when the owner then has more than the most allowed (LEASH_MAX_SESSIONS)
-- the oldest are revoked, in one step, so two sign-ins at once can never leave more.
-- KEYS[1] the owner's sessions (id -> token digest)  KEYS[2] their ids by expiry
-- KEYS[3] the set of owners with sessions (the start-up sweep's list)
-- ARGV[1] session id  ARGV[2] token digest  ARGV[3] now (unix seconds)  ARGV[4] lifetime (s)
-- ARGV[5] most sessions per owner  ARGV[6] owner
-- Returns how many sessions were revoked to make room.
local now, lifetime, most = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, id in ipairs(lapsed) do redis.call('HDEL', KEYS[1], id) end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], now + lifetime, ARGV[1])
local over = redis.call('ZCARD', KEYS[2]) - most
if over > 0 then
  for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, over - 1)) do redis.call('HDEL', KEYS[1], id) end
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, over - 1)
else
  over = 0
end
redis.call('EXPIRE', KEYS[1], lifetime)
redis.call('EXPIRE', KEYS[2], lifetime)
redis.call('SADD', KEYS[3], ARGV[6])
return over
