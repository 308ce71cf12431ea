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

    connection = connect_checked()
    found = checks(connection) + _proxy_checks(connection)
    failed = any(c.verdict == "fail" for c in found)
    if as_json:
        click.echo(json.dumps({"ok": not failed, "checks": [c.as_dict() for c in found]}))
    else:
        for check in found:
            click.echo(f"{MARK[check.verdict]}  {check.name}: {check.detail}")
    from .exit_codes import FAILED, OK

    sys.exit(FAILED if failed else OK)


def _proxy_checks(connection) -> list:
    """With LEASH_TRUSTED_PROXIES=*, whether a request came without the platform router's
    X-Forwarded-For in the last week (web/proxy_check.py notes one): then anyone who reaches the
    app that way can name any client address to the guessing limits."""
    from jobs.config.front import web_server
    from jobs.core import clock
    from jobs.observability import direct_requests
    from jobs.read.redis_health import Check

    if (web_server().trusted_proxies or "").strip() != "*":
        return []
    seen = direct_requests.latest(connection)
    if not seen:
        return [Check("trusted proxies", "ok", "*: every request the web app noted came through a proxy "
                                               "(X-Forwarded-For)")]
    return [Check("trusted proxies", "warn", f"* but a request from {seen.get('peer')} to {seen.get('path')} came "
                  f"without X-Forwarded-For at {clock.iso(float(seen.get('at') or 0))}: the app is reachable other "
                  "than through the platform's router, and there any client can name its own address to the "
                  "guessing limits; set LEASH_TRUSTED_PROXIES to the router's address, or keep the app unreachable "
                  "but through it")]
