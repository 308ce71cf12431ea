#!/usr/bin/env python3
"""What polling costs: 100 browser tabs watching jobs, on the job page's backoff schedule
(``jobs.read.poll_schedule.poll_delay``: every 1 s for the first 10 s, then every 5 s) against a fixed
1 s schedule.

    python benchmarks/bench_polling.py                 # computed + a 20 s real run per schedule
    python benchmarks/bench_polling.py --real-seconds 0   # computed only

Computed: each tab polls at t = 0 and then after ``delay(elapsed)`` seconds, over 60 s of
simulated time; requests are counted per window. Measured: the real app (in-process,
threaded werkzeug server) on a Redis of its own started on a free loopback port; each tab
is a thread sending ``GET /jobs/<id>`` with ``If-None-Match`` as the page's fetch does, for
a job that stays queued (an idle tab: the case that must stay cheap). Nothing outside the
private Redis is touched.
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cli.devserver import free_port, start_redis, stop  # noqa: E402
from jobs.read.poll_schedule import FAST_PERIOD, poll_delay  # noqa: E402


def fixed_delay(elapsed: float) -> float:
    return 1.0


SCHEDULES: dict[str, Callable[[float], float]] = {"fixed 1 s": fixed_delay, "backoff": poll_delay}


def poll_times(delay: Callable[[float], float], seconds: float) -> list[float]:
    times, t = [], 0.0
    while t < seconds:
        times.append(t)
        t += delay(t)
    return times


def window_rates(times_per_tab: list[list[float]], windows: list[tuple[float, float]]) -> list[float]:
    return [sum(1 for times in times_per_tab for t in times if lo <= t < hi) / (hi - lo) for lo, hi in windows]


def computed(tabs: int, seconds: float) -> dict[str, list[float]]:
    windows = [(0, FAST_PERIOD), (FAST_PERIOD, seconds), (0, seconds)]
    return {name: window_rates([poll_times(delay, seconds)] * tabs, windows) for name, delay in SCHEDULES.items()}


class Tab(threading.Thread):
    """One browser tab: polls, keeps the ETag, sleeps the schedule's delay after each answer."""

    def __init__(self, port: int, path: str, delay: Callable[[float], float], seconds: float, start_at: float):
        super().__init__(daemon=True)
        self.port, self.path, self.delay, self.seconds, self.start_at = port, path, delay, seconds, start_at
        self.requests: list[tuple[float, int, float]] = []  # (elapsed at send, status, latency)

    def run(self) -> None:
        etag = None
        time.sleep(max(0.0, self.start_at - time.monotonic()))
        began = time.monotonic()
        while (elapsed := time.monotonic() - began) < self.seconds:
            headers = {"Accept": "application/json"}
            if etag:
                headers["If-None-Match"] = etag
            sent = time.monotonic()
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            try:
                connection.request("GET", self.path, headers=headers)
                response = connection.getresponse()
                response.read()
                etag = response.getheader("ETag") or etag
                status = response.status
            except OSError:
                status = 0
            finally:
                connection.close()
            self.requests.append((elapsed, status, time.monotonic() - sent))
            time.sleep(max(0.0, self.delay(time.monotonic() - began) - (time.monotonic() - sent)))


def real_run(tabs: int, seconds: float) -> dict[str, dict]:
    from werkzeug.serving import make_server

    from jobs.enqueue import enqueue

    workdir = Path(tempfile.mkdtemp(prefix="leash-bench-polling-"))
    redis_proc, url = start_redis(workdir)
    os.environ["REDIS_URL"] = url
    logging_off()
    from web.app import create_app

    app = create_app({"SECRET_KEY": "bench", "REDIS_URL": url})
    connection = app.extensions["leash_redis"]
    job_id, _ = enqueue(connection, "classify", {"items": ["x"], "labels": ["a", "b"]}, owner="shared")
    port = free_port()
    server = make_server("127.0.0.1", port, app, threaded=True)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    results = {}
    try:
        for name, delay in SCHEDULES.items():
            commands_before = int(connection.info("stats")["total_commands_processed"])
            start_at = time.monotonic() + 0.5
            # Tabs open within the same second, as after a page of links is opened at once.
            threads = [Tab(port, f"/jobs/{job_id}", delay, seconds, start_at + i / tabs) for i in range(tabs)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(seconds + 30)
            commands = int(connection.info("stats")["total_commands_processed"]) - commands_before
            requests = [r for thread in threads for r in thread.requests]
            windows = [(0, FAST_PERIOD), (FAST_PERIOD, seconds), (0, seconds)]
            rates = [sum(1 for t, _, _ in requests if lo <= t < hi) / (hi - lo) for lo, hi in windows]
            results[name] = {
                "rates": rates, "requests": len(requests),
                "not_modified": sum(1 for _, status, _ in requests if status == 304),
                "errors": sum(1 for _, status, _ in requests if status not in (200, 304)),
                "median_ms": 1000 * statistics.median(latency for _, _, latency in requests),
                "redis_commands_per_poll": commands / max(1, len(requests)),
            }
    finally:
        server.shutdown()
        stop([redis_proc], grace=5)
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def logging_off() -> None:
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    logging.getLogger("web.app").setLevel(logging.ERROR)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tabs", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=60.0, help="simulated seconds (computed part)")
    parser.add_argument("--real-seconds", type=float, default=20.0,
                        help="seconds per schedule of the real run (0: skip it)")
    args = parser.parse_args()

    print(f"Polling cost of {args.tabs} tabs watching a job (schedule: jobs.read.poll_schedule.poll_delay)\n")
    print(f"Computed over {args.seconds:g} s of simulated time, requests/s:")
    print(f"  {'schedule':<10} {'0-10 s':>8} {f'10-{args.seconds:g} s':>9} {f'whole {args.seconds:g} s':>9}")
    rates = computed(args.tabs, args.seconds)
    for name, (early, late, whole) in rates.items():
        print(f"  {name:<10} {early:>8.1f} {late:>9.1f} {whole:>9.1f}")
    fixed, backoff = rates["fixed 1 s"], rates["backoff"]
    print(f"  backoff sends {fixed[1] / backoff[1]:.1f}x fewer requests after the first 10 s "
          f"({fixed[2] / backoff[2]:.1f}x fewer over the whole {args.seconds:g} s)\n")

    if args.real_seconds > 0:
        print(f"Measured against the real app ({args.real_seconds:g} s per schedule, werkzeug threaded server, "
              "private Redis):")
        measured = real_run(args.tabs, args.real_seconds)
        print(f"  {'schedule':<10} {'0-10 s':>8} {f'10-{args.real_seconds:g} s':>9} {'requests':>9} {'304s':>6} "
              f"{'errors':>6} {'median ms':>9} {'Redis cmds/poll':>15}")
        for name, m in measured.items():
            early, late, _ = m["rates"]
            print(f"  {name:<10} {early:>8.1f} {late:>9.1f} {m['requests']:>9} {m['not_modified']:>6} "
                  f"{m['errors']:>6} {m['median_ms']:>9.1f} {m['redis_commands_per_poll']:>15.2f}")
        f_late, b_late = measured["fixed 1 s"]["rates"][1], measured["backoff"]["rates"][1]
        print(f"  measured: backoff sends {f_late / b_late:.1f}x fewer requests after the first 10 s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
