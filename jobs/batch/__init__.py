"""Batch mode: a job's items through the provider's batch API (payload ``mode: "batch"``), the
job parked while the provider works. ``run`` (one turn of a batch job on a worker: create its
batches, or look at them; ``run.run`` is what ``ctx.through_batch`` calls), ``looks`` (a look:
read what ended, then end the job or park it again), ``room`` (under a budget, which items go
in the next part), ``parts`` (which items each provider batch holds, and their custom ids),
``cached`` (the items the request cache answers, never sent) and ``canceled`` (what a canceled
batch answered before its cancel, counted).

Above the lifecycle core (``jobs.core``), which never imports it: the runner hands ``run.run``
to the job's context, and the doors call ``run.cancel_at_provider`` after a cancel."""
