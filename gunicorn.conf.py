"""gunicorn settings; gunicorn reads this file from the working directory by itself, so the
Procfile's ``web:`` line needs no ``-c``.

Several worker processes answer /metrics in turn, so prometheus-client's multiprocess mode is
on: each process writes its counters to files in ``PROMETHEUS_MULTIPROC_DIR`` and a scrape
sums them. Without the variable, a fresh directory is made (it must be set before any worker
imports prometheus-client), and a dead worker's live gauges are dropped on ``child_exit``.
"""

import os
import secrets
import shutil
import tempfile

# Heroku sends SIGKILL 30 s after SIGTERM: finish in-flight requests well before that.
graceful_timeout = 25
timeout = 30

# gunicorn 25+ opens a control socket for `gunicornc` at one path per user
# ($XDG_RUNTIME_DIR/gunicorn.ctl or ~/.gunicorn/gunicorn.ctl), shared by every gunicorn that
# user runs: a second app's server would take it over. Off, unless
# LEASH_GUNICORN_CONTROL_SOCKET names a path for this server alone.
control_socket = os.environ.get("LEASH_GUNICORN_CONTROL_SOCKET") or ""
control_socket_disable = not control_socket

_made_dir = None
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    _made_dir = tempfile.mkdtemp(prefix="leash-prometheus-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = _made_dir
else:
    # Files left by a previous run would be added to this run's counters.
    os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"], exist_ok=True)
    for name in os.listdir(os.environ["PROMETHEUS_MULTIPROC_DIR"]):
        if name.endswith(".db") and name.startswith(("counter_", "gauge_", "histogram_", "summary_")):
            os.remove(os.path.join(os.environ["PROMETHEUS_MULTIPROC_DIR"], name))

if not (os.environ.get("SECRET_KEY") or os.environ.get("LEASH_SECRET_KEY")):
    # Every worker must sign sessions with the same key, or a browser's owner id would be
    # valid in one worker and not the next. The app still warns: restarts forget sessions.
    os.environ["LEASH_SECRET_KEY"] = secrets.token_urlsafe(32)
    os.environ["LEASH_SECRET_KEY_GENERATED"] = "1"


def child_exit(server, worker):
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):
    if _made_dir:
        shutil.rmtree(_made_dir, ignore_errors=True)
