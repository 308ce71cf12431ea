"""How long Redis keeps each owner's daily usage is a setting (LEASH_USAGE_DAYS_KEPT, default 400
days): the day's record takes that expiry, and `leash usage` reads back no further."""

from __future__ import annotations

from click.testing import CliRunner

from cli import main
from jobs import keys
from jobs.enqueue import enqueue
from jobs.usage.meter import utc_day
from tests.test_items_workers import ended


def test_an_owners_daily_usage_is_kept_for_the_days_the_setting_names(conn, burst, model_server, env):
    env.setenv("LEASH_USAGE_DAYS_KEPT", "30")
    job_id, _ = enqueue(conn, "prompt", {"items": ["a", "b"], "template": "{item}"}, owner="carol")
    burst()
    assert ended(conn, job_id)["state"] == "succeeded"
    ttl = conn.ttl(keys.usage_owner_day("carol", utc_day()))
    assert 29 * 86400 < ttl <= 30 * 86400, ttl

    result = CliRunner().invoke(main, ["usage", "--owner", "carol", "--since", "31d"])
    assert result.exit_code == 2 and "LEASH_USAGE_DAYS_KEPT" in result.output
    assert CliRunner().invoke(main, ["usage", "--owner", "carol", "--since", "30d"]).exit_code == 0
