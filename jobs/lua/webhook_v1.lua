-- KEYS: job
-- webhook_v1: a job's completion webhook, kept in its record so that every status read (the
-- page, GET /jobs/<id>, the lists) shows it without another round trip. Two steps:
--   'begin'   the sweep (jobs/webhooks/outbox.py) starts the webhook of one ending: its delivery
--             id, no attempt yet. Once per ending: an ending already begun, a job with no record,
--             or a record whose ending is no longer this one (replayed since) is left alone.
--   'attempt' a delivery (jobs/webhooks/delivery.py) records one attempt: the count, the state
--             (pending, delivered, given up) and the attempt itself in a short log (the last
--             ARGV[5] kept). An attempt of a delivery id the record no longer holds (the job was
--             replayed and ended again) is not recorded: the record shows the newest ending's.
-- KEYS[1] job hash
-- ARGV[1] 'begin' or 'attempt'
-- begin:   ARGV[2] the ending (the record's ended_at as read)  ARGV[3] the delivery id
-- attempt: ARGV[2] the delivery id  ARGV[3] the attempt (JSON)  ARGV[4] the state  ARGV[5] log length
-- Returns 1 when written, 0 when left alone.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[1] == 'begin' then
  if (redis.call('HGET', KEYS[1], 'ended_at') or '') ~= ARGV[2] or ARGV[2] == '' then return 0 end
  if redis.call('HGET', KEYS[1], 'webhook_ending') == ARGV[2] then return 0 end
  redis.call('HSET', KEYS[1], 'webhook_ending', ARGV[2], 'webhook_id', ARGV[3], 'webhook_state', 'pending',
    'webhook_attempts', 0, 'webhook_log', '[]')
  return 1
end
if redis.call('HGET', KEYS[1], 'webhook_id') ~= ARGV[2] then return 0 end
local log = cjson.decode(redis.call('HGET', KEYS[1], 'webhook_log') or '[]')
table.insert(log, cjson.decode(ARGV[3]))
while #log > tonumber(ARGV[5]) do table.remove(log, 1) end
redis.call('HSET', KEYS[1], 'webhook_log', cjson.encode(log), 'webhook_state', ARGV[4])
redis.call('HINCRBY', KEYS[1], 'webhook_attempts', 1)
return 1
