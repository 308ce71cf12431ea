#!/usr/bin/env python3
"""How long a newcomer waits for a first result, following the README to the letter.

    python benchmarks/bench_first_result.py                 # this checkout, cloned to a temp dir
    python benchmarks/bench_first_result.py --runs 3 --source https://github.com/<owner>/leash

Each run, in a fresh directory: ``git clone``, the README's first command split in its steps
(``python3 -c`` its version check, ``python3 -m venv .venv``, ``.venv/bin/pip install -e .``,
``.venv/bin/leash dev``), then in "a second terminal" the README's ``leash submit --name "first
try" ... examples/items.txt`` (three items), ``leash watch`` until it exits, ``leash results``;
finally Ctrl-C (SIGINT) to ``leash dev``. Each step is timed from the
newcomer's side: the command's start to its end, or to the moment the web app answers.

pip's cache decides the install time: a machine that installed these versions before is "warm";
``--cold`` gives pip an empty cache of its own (every wheel downloaded again). Nothing outside
the temp directory is touched: ``leash dev`` picks free ports and records its Redis under the
temp directory's own XDG_STATE_HOME.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The README's first command, its steps apart: the version check, then the venv.
VERSION_CHECK = 'import sys; sys.exit(sys.version_info < (3, 11) and "leash needs Python 3.11 or newer")'
PYTHON = shutil.which("python3") or sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(command: list[str], cwd: Path, env: dict, stdin: str | None = None) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(command, cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return time.monotonic() - started, done.stdout


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def one_run(source: str, cold: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="leash-newcomer-") as tmp:
        work = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_URL", "LEASH_"))}
        env["XDG_STATE_HOME"] = str(work / "state")
        if cold:
            env["PIP_CACHE_DIR"] = str(work / "pip-cache")
        figures: dict[str, float] = {}
        figures["git clone"], _ = timed(["git", "clone", "-q", source, "leash"], work, env)
        repo = work / "leash"
        figures["python3 version check"], _ = timed([PYTHON, "-c", VERSION_CHECK], repo, env)
        figures["venv"], _ = timed([PYTHON, "-m", "venv", ".venv"], repo, env)
        figures["pip install -e ."], _ = timed([".venv/bin/pip", "install", "-q", "-e", "."], repo, env)

        port = free_port()
        started = time.monotonic()
        dev = subprocess.Popen([".venv/bin/leash", "dev", "--port", str(port)], cwd=repo, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = started + 120
            while not answers(f"http://127.0.0.1:{port}/healthz"):
                if dev.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"leash dev did not answer (exit {dev.poll()})")
                time.sleep(0.05)
            figures["leash dev until the web app answers"] = time.monotonic() - started
            # leash dev's worker may still be starting: the newcomer does not wait for it, nor do we.
            env["LEASH_WEB_URL"] = f"http://127.0.0.1:{port}/"
            submit, out = timed([".venv/bin/leash", "submit", "--name", "first try", "--labels",
                                 "positive,negative,question", "examples/items.txt"], repo, env)
            job_id = out.strip()
            watch, _ = timed([".venv/bin/leash", "watch", job_id], repo, env)
            figures["leash submit"], figures["leash watch (job to its end)"] = submit, watch
            figures["leash results"], results = timed([".venv/bin/leash", "results", job_id], repo, env)
            if len(results.splitlines()) != 3:
                raise SystemExit(f"expected 3 results, got: {results}")
        finally:
            stopped = time.monotonic()
            if dev.poll() is None:
                os.killpg(dev.pid, signal.SIGINT)  # Ctrl-C reaches the whole terminal group
            try:
                dev.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(dev.pid, signal.SIGKILL)
                dev.wait()
        figures["Ctrl-C until leash dev exits"] = time.monotonic() - stopped
        figures["clone to first result"] = sum(v for k, v in figures.items() if k != "Ctrl-C until leash dev exits")
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default=str(ROOT), help="what to git clone (default: this checkout)")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--cold", action="store_true", help="an empty pip cache: every package downloaded")
    args = parser.parse_args()
    runs = [one_run(args.source, args.cold) for _ in range(args.runs)]
    print(f"{'step':42} {'median s':>9} {'min':>7} {'max':>7}   ({args.runs} run(s), pip cache "
          f"{'cold' if args.cold else 'warm'}, {os.cpu_count()} cores)")
    for step in runs[0]:
        values = [run[step] for run in runs]
        print(f"{step:42} {statistics.median(values):9.2f} {min(values):7.2f} {max(values):7.2f}")


if __name__ == "__main__":
    main()
