"""The worker process that ``leash worker`` runs: ``leash_worker`` (``LeashWorker``, RQ's forking
Worker with leases: claims, forks, hands the attempt to the runner),
``chores`` (the main process's periodic work: reaping, archive and webhook sweeps, the request
cache, Sentinel's primary, a dead scheduler restarted, the running attempt watched),
``endings`` (how an attempt ends in RQ's terms: a killed work-horse, a canceled job's RQ error),
``shutdown`` (how it stops: deploy hand-off, a signal said twice, a clean way out),
``dequeue`` (taking a job off several queues without a window that loses it), ``scheduler``
and ``scheduler_locks`` (RQ's retry scheduler, made stoppable and freed when its worker dies)
and ``log`` (what a deploy or a lost lease writes to the log: one line, no traceback).
"""
