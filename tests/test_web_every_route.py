"""A fuzz run over every route in the app's url_map (leash's and rq-dashboard's): odd bodies
(JSON of every type, huge and odd form fields, wrong content types) sent with every method a
route takes, as an anonymous visitor, an API caller, a signed-in browser and the operator, with
CSRF checks on and off. Not one answer is a 5xx; every JSON error names what is wrong."""

from __future__ import annotations

import json
from collections import Counter
from urllib.parse import urlencode

import flask_wtf.csrf
import pytest

from tests.test_schema_guard import NESTED, REDOS, REFUSED, SELF, ref_chain
from tests.web_support import CLASSIFY, HTML, TOKENS, basic, bearer, create_app_with, sign_in

USER, PASSWORD = "operator", "pw"
BIG = "x" * 200_000

BODIES = [
    ("application/json", json.dumps(v)) for v in
    ([1, 2], 1, "x", None, True, -0.0, 1e308, {}, {"a": [None]}, [[[[[]]]]], {"kind": 1, "items": "x"},
     {"token": {"x": 1}}, {"budget": {"usd": "sNaN"}})
] + [
    ("application/json", "{not json"),
    ("application/json", "\udcff".encode("utf-8", "surrogatepass")),
    ("application/x-www-form-urlencoded", "token=" + BIG),
    ("application/x-www-form-urlencoded", "&".join(f"f{i}=v" for i in range(5000))),
    ("application/x-www-form-urlencoded", "budget_usd=sNaN&budget_tokens=" + "9" * 5000 + "&kind=%ff%fe"),
    ("application/x-www-form-urlencoded", "=&&==&%zz=%"),
    ("multipart/form-data", b"--x\r\nbroken"),
    ("multipart/form-data; boundary=x", b"--x\r\nContent-Disposition: form-data; name=\"items_file\"; "
                                        b"filename=\"a.csv\"\r\n\r\n\"\xff,\r\n--x--\r\n"),
] + [
    # Hostile `extract` schemas (tests/test_schema_guard.py): backtracking and 500-deep patterns, a
    # doubling $ref chain, a $ref to itself and to a loopback URL, at the API and at the form.
    ("application/json", json.dumps({"kind": "extract", "items": ["a" * 40 + "!"], "schema": schema, "dry_run": dry}))
    for schema, dry in ((REDOS, False), (NESTED, False), (ref_chain(), True), (SELF, False),
                        (REFUSED["url"][0], True))
] + [
    ("application/x-www-form-urlencoded", urlencode({"kind": "extract", "items": "a review", "schema": json.dumps(schema),
                                                     **button}))
    for schema, button in ((NESTED, {"estimate": "1"}), (SELF, {}), (ref_chain(), {"estimate": "1"}))
] + [
    ("text/plain", "hello"),
    ("application/xml", "<a/>"),
    ("", b"\x00\x01\x02"),
]


def _address(rule, job_id: str, pipeline_id: str = "p-none") -> str:
    values = {"job_id": job_id, "pipeline_id": pipeline_id, "queue_name": "leash", "registry_name": "failed", "per_page": 10, "order": "asc",
              "page": 1, "instance_number": 0, "filename": "style.css", "fmt": "csv", "worker_name": "w1"}
    path = rule.rule
    for name in rule.arguments:
        path = path.replace(f"<{name}>", str(values[name]))
        for converter in ("int", "path", "any(csv, jsonl)"):
            path = path.replace(f"<{converter}:{name}>", str(values[name]))
    assert "<" not in path, path
    return path


def _identities(app):
    anonymous = app.test_client()
    api = app.test_client()
    browser = app.test_client()
    sign_in(browser, "alice")
    return [("anonymous", anonymous, {}), ("api", api, bearer("alice")), ("browser", browser, HTML),
            ("operator", app.test_client(), basic(USER, PASSWORD))]


# With CSRF checks off the bodies reach the views; there anonymous visitors may also use the form
# (LEASH_PUBLIC_SUBMIT=1), so its Submit and Estimate meet the hostile schemas too.
@pytest.mark.parametrize(("csrf", "public"), [(True, False), (False, True)], ids=["csrf-on", "csrf-off-public"])
def test_no_route_answers_any_odd_body_with_a_5xx(conn, csrf, public, monkeypatch):
    monkeypatch.setenv("LEASH_GUESS_RATE", "100000/minute")  # the identities' wrong doors must not lock them out
    if not csrf:  # every token accepted: the bodies reach the views behind the check
        monkeypatch.setattr(flask_wtf.csrf, "validate_csrf", lambda *args, **kwargs: None)
    app = create_app_with(LEASH_API_TOKENS=",".join(f"{o}={t}" for o, t in TOKENS.items()),
                          LEASH_DASHBOARD_USER=USER, LEASH_DASHBOARD_PASSWORD=PASSWORD,
                          LEASH_MAX_BODY_BYTES=1024 * 1024, LEASH_PUBLIC_SUBMIT=public)
    job_id = app.test_client().post("/jobs", json=CLASSIFY, headers=bearer("alice")).get_json()["job_id"]
    pipeline_id = app.test_client().post("/pipelines", json={"stages": [{"name": "one", **CLASSIFY}]},
                                         headers=bearer("alice")).get_json()["pipeline_id"]
    rules = list(app.url_map.iter_rules())
    assert any(r.endpoint.startswith("rq_dashboard.") for r in rules)
    statuses: Counter = Counter()
    for rule in rules:
        path = _address(rule, job_id, pipeline_id)
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            for _who, client, headers in _identities(app):
                for content_type, body in (BODIES if method != "GET" else [("", b"")]):
                    with client.open(path, method=method, data=body, headers=headers,
                                     content_type=content_type or None) as response:
                        response.get_data()  # a streamed answer (result.csv) read to its end
                    if path == "/readyz" and response.status_code == 503:
                        # Readiness says "not ready" with a 503 by design (no worker in this test).
                        assert response.get_json()["problems"], response.data
                        continue
                    statuses[response.status_code] += 1
                    assert response.status_code < 500, (method, path, _who, content_type, response.data[:300])
                    if response.status_code >= 400 and response.mimetype == "application/json":
                        assert response.get_json()["error"], (method, path)
    print(f"\nevery route ({len(rules)} rules): {sum(statuses.values())} requests, statuses {dict(sorted(statuses.items()))}")
    assert max(statuses) < 500
