"""Completion webhooks: a POST when a job ends, signed as the Standard Webhooks spec says.

    a job ends ──retain──▶ ending.note: its id in WEBHOOKS_DUE (any ending: succeeded, failed, canceled)
                                │
    a worker's tick ──▶ outbox.sweep: for a due job that ended with a webhook URL, in one transaction:
                                │       the ending begun in its record (webhook_v1 'begin': a delivery id,
                                │       once per ending) and an RQ job of its own enqueued on the job's queue
                                ▼
    any worker ──▶ delivery.deliver: checks the address again, signs, POSTs; each attempt recorded in the
                   job's record (webhook_v1 'attempt'); not 2xx → raises, and RQ's Retry (its scheduler)
                   brings it back after each LEASH_WEBHOOK_BACKOFF interval in turn

Delivered at least once, with the same ``webhook-id`` on every attempt (receivers deduplicate by
it); never by the worker that ran the job while it runs; to private or loopback addresses only when
LEASH_WEBHOOK_ALLOW_PRIVATE=1. RQ's own ``webhooks=`` are not used: they are sent once, unsigned,
by the work-horse as RQ's job ends, and RQ's statuses are not leash's outcomes.
"""
