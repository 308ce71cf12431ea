"""The worker process that ``leash worker`` runs: ``leash_worker`` (``LeashWorker``, RQ's forking
Worker with leases and reaping),
``shutdown`` (how it stops: deploy hand-off, a signal said twice, a clean way out),
``dequeue`` (taking a job off several queues without a window that loses it), ``scheduler``
and ``scheduler_locks`` (RQ's retry scheduler, made stoppable and freed when its worker dies)
and ``log`` (what a deploy or a lost lease writes to the log: one line, no traceback).
"""
