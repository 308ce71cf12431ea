"""What operators see of a running deployment besides its state: log lines (``logs``: plain or
one JSON object per line with the job's id, attempt, kind and owner) and error reports
(``reporting``: Sentry, when ``SENTRY_DSN`` is set)."""
