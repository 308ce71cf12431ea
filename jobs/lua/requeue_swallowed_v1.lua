-- KEYS: job rq_intermediate rq_queue
-- requeue_swallowed_v1: a worker took a job off the queue (RQ's BLMOVE into the intermediate
-- list) and died before claiming it. Put it back at the front of the queue: it never started,
-- so no attempt is counted. A job that was claimed meanwhile (state running) is left alone.
-- KEYS[1] job hash  KEYS[2] rq intermediate list  KEYS[3] rq queue list
-- ARGV[1] job_id
-- Returns 1 if the job went back to the queue, else 0.
if redis.call('HGET', KEYS[1], 'state') ~= 'queued' then
  return 0
end
if redis.call('LREM', KEYS[2], 1, ARGV[1]) == 0 then
  return 0
end
redis.call('LPUSH', KEYS[3], ARGV[1])
return 1
