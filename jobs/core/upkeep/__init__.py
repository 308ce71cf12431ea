"""The sweeps that keep every job's state true: the reaper (expired leases, due cancels), the
consistency sweep against RQ's side (jobs deleted or failed by RQ's own tools, lost batch looks)."""
