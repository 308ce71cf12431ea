-- KEYS: job usage owner_day model_usage reservations reservation_records
-- usage_record_v2: count the usage of model calls that came with no item write (an item
-- that failed, a call outside ``for_each``, an attempt that is ending). Not fenced: a call a
-- superseded attempt made was paid for all the same. A write sent again after its reply was
-- lost (the worker retries it through a Redis blip) counts once: add_usage_once knows the
-- repeat.
-- KEYS[1] job hash  KEYS[2] job usage hash  KEYS[3] owner's usage for the UTC day
-- KEYS[4] the model's usage totals  KEYS[5] the owner's reservations (by deadline)
-- KEYS[6] their records (the usage JSON's "r" names the ones this write settles)
-- ARGV[1] token  ARGV[2] usage JSON (see add_usage_once)  ARGV[3] the UTC day its calls were
-- admitted on, which KEYS[3] is  ARGV[4] attempt number
-- ARGV[5] usage hash ttl  ARGV[6] owner day ttl
-- Returns 1.
add_usage_once(KEYS[1], KEYS[2], KEYS[3], KEYS[4], cjson.decode(ARGV[2]), ARGV[1], ARGV[3], ARGV[4], ARGV[5],
  ARGV[6], KEYS[5], KEYS[6])
return 1
