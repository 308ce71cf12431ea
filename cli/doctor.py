"""``leash doctor``: is this deployment's Redis fit to hold jobs, and are workers there?"""

from __future__ import annotations

import json
import sys

import click

MARK = {"ok": "ok  ", "warn": "warn", "fail": "FAIL"}


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object: every check and the verdict.")
def doctor(as_json):
    """Check the deployment: Redis version, persistence, maxmemory and its policy, memory
    headroom, clients, workers and their clocks. Exit status 1 when a check fails."""
    from jobs.read.redis_health import checks

    from .redis_target import connect_checked

    found = checks(connect_checked())
    failed = any(c.verdict == "fail" for c in found)
    if as_json:
        click.echo(json.dumps({"ok": not failed, "checks": [c.as_dict() for c in found]}))
    else:
        for check in found:
            click.echo(f"{MARK[check.verdict]}  {check.name}: {check.detail}")
    from .exit_codes import FAILED, OK

    sys.exit(FAILED if failed else OK)
