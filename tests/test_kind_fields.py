"""A kind declares its fields once: the API checks them, the form has a box for each, the job
page shows what was submitted, and every kind's fields -- the built-in ones' and those of your
own modules in LEASH_IMPORTS -- are options of ``leash submit``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from jobs import kinds
from jobs.core import states
from jobs.errors import InvalidJob
from tests.conftest import REDIS_URL, ROOT
from tests.web_support import HTML, csrf_from


def _check_volume(payload: dict) -> None:
    if payload.get("volume") not in ("low", "high"):
        raise InvalidJob("'volume' must be low or high")


VOLUME = kinds.Field("volume", "Volume", "low or high", check=_check_volume, placeholder="high")


@pytest.fixture
def shout_kind():
    """A kind registered for one test, with one declared field and nothing else written for it."""

    @kinds.kind("shout", fields=(VOLUME,))
    def shout(ctx, payload):
        return {"items": len(payload["items"])}

    yield shout
    del kinds.KINDS["shout"]


def test_the_api_checks_a_declared_field_and_refuses_undeclared_ones(client, shout_kind):
    missing = client.post("/jobs", json={"kind": "shout", "items": ["a"]})
    assert missing.status_code in (400, 422) and "'volume' must be low or high" in missing.get_json()["error"]
    unknown = client.post("/jobs", json={"kind": "shout", "items": ["a"], "volume": "low", "labels": ["x"]})
    assert unknown.status_code in (400, 422) and "labels" in unknown.get_json()["error"]
    created = client.post("/jobs", json={"kind": "shout", "items": ["a"], "volume": "low"})
    assert created.status_code == 202, created.get_json()
    status = client.get(f"/jobs/{created.get_json()['job_id']}").get_json()
    assert status["submitted"] == {"volume": "low"}


def test_the_form_has_a_box_for_the_field_and_the_job_page_a_row(client, shout_kind):
    page = client.get("/", headers=HTML)
    html = page.data.decode()
    assert 'name="volume"' in html and "Volume" in html and "For <strong>shout</strong>: low or high" in html
    # A box left filled for another kind is not sent with this one.
    posted = client.post("/", headers=HTML, data={
        "csrf_token": csrf_from(page.data), "submission": "fields-form-1", "kind": "shout", "items": "one\ntwo",
        "volume": " high ", "labels": "left, over"})
    assert posted.status_code == 303, posted.data.decode()[:500]
    job_page = client.get(posted.headers["Location"], headers=HTML).data.decode()
    assert re.search(r'<dt>Volume</dt><dd id="volume">\s*high</dd>', job_page)
    assert client.get(posted.headers["Location"]).get_json()["submitted"] == {"volume": "high"}


def test_the_form_names_a_wrong_field_beside_its_box(client, shout_kind):
    page = client.get("/", headers=HTML)
    refused = client.post("/", headers=HTML, data={
        "csrf_token": csrf_from(page.data), "submission": "fields-form-2", "kind": "shout", "items": "one",
        "volume": "deafening"})
    assert refused.status_code == 422
    assert re.search(r'id="volume-error"[^>]*>\s*The volume must be low or high', refused.data.decode())


def test_every_built_in_field_is_an_option_of_leash_submit():
    from cli import main

    usage = CliRunner().invoke(main, ["submit", "--help"]).output
    declared = [field for field, _ in kinds.fields()]
    assert {f.name for f in declared} >= {"labels", "template", "schema", "max_item_errors"}
    for field in declared:
        assert "--" + field.name.replace("_", "-") in usage  # max_item_errors is --max-item-errors


_OWN_KINDS = '''
from jobs.errors import InvalidJob
from jobs.kinds import Field, kind

def _check_tone(payload):
    if payload.get("tone") not in ("plain", "formal"):
        raise InvalidJob("'tone' must be plain or formal")

TONE = Field("tone", "Tone", "plain or formal", check=_check_tone, missing="give --tone plain or --tone formal")

@kind("summarise", fields=(TONE,))
def summarise(ctx, payload):
    return {"items": len(payload["items"])}
'''


def _leash(tmp_path, imports: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    """The ``leash`` command in a process of its own, with the user's module in LEASH_IMPORTS:
    what a user types, where the CLI is imported before their kinds are."""
    env = {**os.environ, "REDIS_URL": REDIS_URL, "LEASH_IMPORTS": imports,
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", "cli", *args], input=stdin, capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=60)


def test_a_field_of_your_own_kind_is_an_option_of_leash_submit(tmp_path, conn):
    (tmp_path / "my_kinds.py").write_text(_OWN_KINDS)
    usage = _leash(tmp_path, "my_kinds", "submit", "--help")
    assert usage.returncode == 0 and "--tone" in usage.stdout and "(summarise)" in usage.stdout
    made = _leash(tmp_path, "my_kinds", "submit", "--kind", "summarise", "--tone", "formal", "--json", "-",
                  stdin="one\ntwo\n")
    assert made.returncode == 0, made.stderr
    job_id = json.loads(made.stdout)["job_id"]
    assert states.status(conn, job_id)["submitted"].get("tone") == "formal"
    wrong = _leash(tmp_path, "my_kinds", "submit", "--kind", "summarise", "--tone", "loud", "-", stdin="one\n")
    assert wrong.returncode == 2 and "--tone must be plain or formal" in wrong.stderr, wrong.stderr
    assert "Traceback" not in wrong.stderr


def test_a_module_in_leash_imports_that_cannot_be_imported_is_one_line_and_exit_2(tmp_path):
    broken = _leash(tmp_path, "no_such_module_here", "submit", "--labels", "a,b", "-", stdin="x\n")
    assert broken.returncode == 2 and "cannot import job kinds (LEASH_IMPORTS)" in broken.stderr
    assert "no_such_module_here" in broken.stderr and "Traceback" not in broken.stderr


def test_a_reduce_job_from_the_api_the_form_and_leash_submit_shows_one_answer(client, conn, burst, tmp_path):
    made = client.post("/jobs", json={"kind": "reduce", "items": ["kettle leaks", "lid broke"],
                                      "instruction": "Summarise the complaints"})
    assert made.status_code == 202, made.get_json()
    refused = client.post("/jobs", json={"kind": "reduce", "items": ["a"]})
    assert refused.status_code in (400, 422) and "'instruction' must be" in refused.get_json()["error"]
    page = client.get("/", headers=HTML)
    assert 'name="instruction"' in page.data.decode()
    posted = client.post("/", headers=HTML, data={
        "csrf_token": csrf_from(page.data), "submission": "fields-form-3", "kind": "reduce",
        "items": "kettle leaks\nlid broke\nhandle hot", "instruction": "Count the complaints"})
    assert posted.status_code == 303, posted.data.decode()[:500]
    typed = _leash(tmp_path, "", "submit", "--kind", "reduce", "--instruction", "Name the worst", "--json", "-",
                   stdin="kettle leaks\nlid broke\n")
    assert typed.returncode == 0, typed.stderr
    burst()
    job_page = client.get(posted.headers["Location"], headers=HTML).data.decode()
    assert "Count the complaints" in job_page and "[local] 3 inputs" in job_page
    assert re.search(r'id="progress-text">1 of 1 model calls', job_page)
    for job_id in (made.get_json()["job_id"], json.loads(typed.stdout)["job_id"]):
        answer = client.get(f"/jobs/{job_id}/result").get_json()
        assert answer["total"] == 1 and len(answer["items"]) == 1, answer
        assert answer["items"][0]["result"].startswith("[local] 2 inputs"), answer
        csv_rows = client.get(f"/jobs/{job_id}/result.csv").data.decode().strip().splitlines()
        assert len(csv_rows) == 2 and "[local] 2 inputs" in csv_rows[1]
    no_instruction = _leash(tmp_path, "", "submit", "--kind", "reduce", "-", stdin="a\n")
    assert no_instruction.returncode == 2 and "--instruction" in no_instruction.stderr, no_instruction.stderr
