-- KEYS: job rq_job rq_intermediate rq_queue
-- requeue_swallowed_v2: a worker took a job off the queue (RQ's BLMOVE into the intermediate
-- list) and died before claiming it. Put it back at the front of the queue: it never started,
-- so no attempt is counted. A job that was claimed meanwhile (state running) is left alone.
-- A look at a batch job waiting at its provider (running, phase waiting: claim_v4 has not
-- handed the look out) is a job too: the look goes back to the front of the queue while RQ
-- still has it queued; an entry left by a look RQ has since scheduled or held again (the job
-- was looked at through another entry) is dropped, as RQ's own cleanup would after a minute.
-- A dead worker's dequeue takes a job when Redis still holds its connection: the worker was
-- killed while blocked in BLMOVE and a child it forked (its retry scheduler) keeps the socket.
-- KEYS[1] job hash  KEYS[2] rq job hash  KEYS[3] rq intermediate list  KEYS[4] rq queue list
-- ARGV[1] job_id
-- Returns 1 if the job (or its look) went back to the queue, 2 if a stale look entry was
-- dropped, else 0.
local fields = redis.call('HMGET', KEYS[1], 'state', 'phase')
local look = fields[1] == 'running' and fields[2] == 'waiting'
if fields[1] ~= 'queued' and not look then
  return 0
end
if redis.call('LREM', KEYS[3], 1, ARGV[1]) == 0 then
  return 0
end
if look and redis.call('HGET', KEYS[2], 'status') ~= 'queued' then
  return 2
end
redis.call('LPUSH', KEYS[4], ARGV[1])
return 1
