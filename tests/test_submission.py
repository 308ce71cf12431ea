"""One submission path for the three doors (jobs/intake/submission.py): the form, the API and
``leash submit`` each check a payload once, and answer a refusal the same way."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from cli import main as cli_main
from jobs import kinds
from jobs.intake import submission
from tests.test_web_estimate import priced  # noqa: F401 (fixture)
from tests.test_web_pages import browser, post_form  # noqa: F401 (fixture)

#: A model with a price, so a submission is priced as well as checked.
pytestmark = pytest.mark.usefixtures("priced")

PROMPT = {"kind": "prompt", "items": ["the kettle is fine", "the lid is loose"], "template": "Say: {item}"}


@pytest.fixture
def counted(monkeypatch):
    """How many times a submission's payload is checked: the kind's validator and the size and
    depth walk of the whole payload, each counted."""
    calls = {"validator": 0, "payload": 0}
    prompt = kinds.get("prompt")
    enqueue_module = sys.modules["jobs.enqueue"]
    validator, check_payload = prompt.validate, enqueue_module.check_payload

    def counting_validator(payload):
        calls["validator"] += 1
        return validator(payload)

    def counting_check_payload(payload):
        calls["payload"] += 1
        return check_payload(payload)

    monkeypatch.setattr(prompt, "validate", counting_validator)
    monkeypatch.setattr(enqueue_module, "check_payload", counting_check_payload)
    return calls


@pytest.mark.parametrize("dry", [False, True])
def test_the_api_checks_a_payload_once(client, conn, counted, dry):
    response = client.post("/jobs", json={**PROMPT, "dry_run": dry})
    assert response.status_code == (200 if dry else 202), response.json
    assert counted == {"validator": 1, "payload": 1}


@pytest.mark.parametrize("dry", [False, True])
def test_the_cli_checks_a_payload_once(conn, counted, dry):
    result = CliRunner().invoke(cli_main, ["submit", "--kind", "prompt", "--template", "Say: {item}", "-",
                                           *(["--dry-run"] if dry else [])], input="one\ntwo\n")
    assert result.exit_code == 0, result.output
    assert counted == {"validator": 1, "payload": 1}


@pytest.mark.parametrize("dry", [False, True])
def test_the_form_checks_a_payload_once(browser, conn, counted, dry):  # noqa: F811 (fixture)
    response = post_form(browser, kind="prompt", items="one\ntwo", template="Say: {item}",
                         **({"estimate": "1"} if dry else {}))
    assert response.status_code == (200 if dry else 303), response.get_data(as_text=True)[:2000]
    assert counted == {"validator": 1, "payload": 1}


def test_a_refused_payload_lists_every_field_for_the_form(conn):
    with pytest.raises(submission.Invalid) as refused:
        submission.submit(conn, submission.Submission("classify", {"items": [], "labels": ["a", "a"]}, "ann",
                                                      name="x" * 101))
    assert [field for field, _ in refused.value.problems] == ["items", "labels", "name"]
    assert str(refused.value) == refused.value.problems[1][1]  # the message enqueue gives: the first it meets


def test_a_repeat_of_an_idempotency_key_is_the_first_job_and_checks_nothing(conn, counted):
    first = submission.submit(conn, submission.Submission("prompt", {"items": ["a"], "template": "{item}"}, "ann",
                                                          idempotency_key="k1"))
    again = submission.submit(conn, submission.Submission("prompt", {"items": []}, "ann", idempotency_key="k1"))
    assert (first.created, again) == (True, submission.Submitted(first.job_id, False))
    assert counted["validator"] == 1
