"""gunicorn settings; gunicorn reads this file from the working directory by itself, so the
Procfile's ``web:`` line needs no ``-c``.

Several worker processes answer /metrics in turn, so prometheus-client's multiprocess mode is
on: each process writes its counters to files in ``PROMETHEUS_MULTIPROC_DIR`` and a scrape
sums them. Without the variable, a fresh directory is made (it must be set before any worker
imports prometheus-client), and a dead worker's live gauges are dropped on ``child_exit``.

Outside ``leash dev`` (``LEASH_DEV=1``) a missing ``SECRET_KEY`` stops the server with one line;
``LEASH_LOG_FORMAT=json`` makes gunicorn's own lines JSON like the app's (jobs/observability/logs.py).
"""

import os
import secrets
import shutil
import sys
import tempfile

# Heroku sends SIGKILL 30 s after SIGTERM: finish in-flight requests well before that.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the app's packages, before gunicorn adds them
# gunicorn reads every known setting name of this module (``config`` is one): import under
# names it does not know.
from jobs.config import export as _export_setting  # noqa: E402  (settings are read in jobs/config.py only)
from jobs.config import get as _setting  # noqa: E402
from jobs.observability import logs  # noqa: E402

graceful_timeout = 25
timeout = 30

# gunicorn 25+ opens a control socket for `gunicornc` at one path per user
# ($XDG_RUNTIME_DIR/gunicorn.ctl or ~/.gunicorn/gunicorn.ctl), shared by every gunicorn that
# user runs: a second app's server would take it over. Off, unless
# LEASH_GUNICORN_CONTROL_SOCKET names a path for this server alone.
control_socket = _setting("LEASH_GUNICORN_CONTROL_SOCKET") or ""
control_socket_disable = not control_socket

_made_dir = None
_metrics_dir = _setting("PROMETHEUS_MULTIPROC_DIR")
if not _metrics_dir:
    _made_dir = _metrics_dir = tempfile.mkdtemp(prefix="leash-prometheus-")
    _export_setting("PROMETHEUS_MULTIPROC_DIR", _made_dir)
else:
    # Files left by a previous run would be added to this run's counters.
    os.makedirs(_metrics_dir, exist_ok=True)
    for name in os.listdir(_metrics_dir):
        if name.endswith(".db") and name.startswith(("counter_", "gauge_", "histogram_", "summary_")):
            os.remove(os.path.join(_metrics_dir, name))

if not (_setting("SECRET_KEY") or _setting("LEASH_SECRET_KEY")):
    if not _setting("LEASH_DEV"):
        # Checked here, in the master, so a deploy without it stops with one line, not a traceback per worker.
        from web.app import SECRET_KEY_MISSING

        sys.stderr.write(SECRET_KEY_MISSING + "\n")
        raise SystemExit(1)
    # leash dev: every worker must sign sessions with the same key, or a browser's owner id
    # would be valid in one worker and not the next.
    _export_setting("LEASH_SECRET_KEY", secrets.token_urlsafe(32))

try:
    if logs.log_format() == "json":
        logconfig_dict = logs.gunicorn_logconfig()
except ValueError as exc:
    sys.stderr.write(f"{exc}\n")
    raise SystemExit(1) from None


def child_exit(server, worker):
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):
    if _made_dir:
        shutil.rmtree(_made_dir, ignore_errors=True)
