"""Property: whatever is posted to the API or the form, the answer is never a 5xx, and every
error is JSON with a non-empty message."""

from __future__ import annotations

import io
import json
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.config import limits
from jobs.intake.limits import json_size
from tests.web_support import CLASSIFY, HTML, create_app_with, csrf_from

JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30)
JSON_VALUES = st.recursive(JSON_SCALARS, lambda children: st.lists(children, max_size=5)
                           | st.dictionaries(st.text(max_size=10), children, max_size=5), max_leaves=30)

# Bodies that look like submissions, with any field replaced or added, hit the validators.
NEAR_MISSES = st.builds(
    lambda base, changes, drop: {k: v for k, v in {**base, **changes}.items() if k not in drop},
    st.just(CLASSIFY),
    st.dictionaries(st.sampled_from(["kind", "items", "labels", "max_attempts", "delay", "extra"]), JSON_VALUES,
                    max_size=3),
    st.sets(st.sampled_from(["kind", "items", "labels"]), max_size=2),
)
CONTENT_TYPES = st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain",
                                 "application/x-www-form-urlencoded", "multipart/form-data", "",
                                 "application/vnd.api+json"])
HEADERS = st.dictionaries(st.sampled_from(["Idempotency-Key", "Authorization", "Accept"]),
                          st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40), max_size=2)


def _check(response):
    assert response.status_code < 500, (response.status_code, response.data[:500])
    if response.status_code >= 400 and response.mimetype == "application/json":
        error = response.get_json()["error"]
        assert isinstance(error, str) and error


_settings = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_settings
@given(body=NEAR_MISSES | JSON_VALUES, headers=HEADERS)
def test_random_json_bodies_never_get_a_5xx(conn, body, headers):
    client = create_app_with().test_client()
    _check(client.post("/jobs", data=json.dumps(body), headers={"Content-Type": "application/json", **headers}))


@_settings
@given(raw=st.binary(max_size=300) | st.text(max_size=300).map(str.encode), content_type=CONTENT_TYPES,
       headers=HEADERS)
def test_random_bytes_and_content_types_never_get_a_5xx(conn, raw, content_type, headers):
    client = create_app_with().test_client()
    _check(client.post("/jobs", data=raw, headers={"Content-Type": content_type, **headers}))


@_settings
@given(path=st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=0x2FF, exclude_characters="?#"),
                    min_size=1, max_size=60),
       query=st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="#"), max_size=40))
def test_random_job_ids_and_query_strings_never_get_a_5xx(conn, path, query):
    client = create_app_with().test_client()
    for url in (f"/jobs/{path}", f"/jobs/{path}/result?{query}", f"/jobs?{query}"):
        _check(client.get(url))
    _check(client.post(f"/jobs/{path}/cancel"))


# Classes of input that once gave a 5xx or unbounded storage: JSON nested around the parser's
# limit, CSV uploads with long cells, bad bytes and broken quotes, huge or odd labels. Each
# test counts what it sent and prints it (run with -s; the figures are in docs/BENCHMARKS.md).

def _report(name: str, statuses: Counter) -> None:
    print(f"\nfuzz {name}: {sum(statuses.values())} requests, statuses {dict(sorted(statuses.items()))}")
    assert statuses and max(statuses) < 500


def test_json_nested_near_the_parsers_limit_never_gets_a_5xx(conn):
    statuses: Counter = Counter()
    client = create_app_with().test_client()

    @_settings
    @given(depth=st.integers(1, 64) | st.integers(900, 1100) | st.integers(2000, 20_000),
           opener=st.sampled_from(["[", '{"a":', '[{"b":']), where=st.sampled_from(["items", "labels", "extra"]))
    def post_nested(depth, opener, where):
        closer = {"[": "]", '{"a":': "}", '[{"b":': "}]"}[opener]
        body = dict(CLASSIFY)
        body.pop(where, None)
        text = json.dumps(body)[:-1] + f', "{where}": ' + opener * depth + '"x"' + closer * depth + "}"
        response = client.post("/jobs", data=text, headers={"Content-Type": "application/json"})
        _check(response)
        statuses[response.status_code] += 1

    post_nested()
    _report("deep JSON", statuses)


CSV_CELLS = st.text(max_size=40) | st.sampled_from(['"', '""', '"open', 'a"b', "\x00", "\r", "\n", ",", "\ufeff"]) \
    | st.integers(10_000, 200_000).map(lambda n: "L" * n)


def test_csv_uploads_with_long_cells_bad_bytes_and_broken_quotes_never_get_a_5xx(conn):
    statuses: Counter = Counter()
    browser = create_app_with().test_client()
    token = csrf_from(browser.get("/", headers=HTML).data)

    @_settings
    @given(rows=st.lists(st.lists(CSV_CELLS, min_size=1, max_size=4), max_size=6),
           encoding=st.sampled_from(["utf-8", "utf-16", "latin-1", "cp1252"]), raw_tail=st.binary(max_size=8),
           number=st.integers(0, 10**9))
    def upload(rows, encoding, raw_tail, number):
        text = "text,other\n" + "\n".join(",".join(cells) for cells in rows)
        content = text.encode(encoding, errors="replace") + raw_tail
        response = browser.post("/", headers=HTML, content_type="multipart/form-data", data={
            "kind": "classify", "labels": "positive, negative", "items": "", "csrf_token": token,
            "submission": f"fuzz-{number:010d}", "items_file": (io.BytesIO(content), "items.csv")})
        assert response.status_code in (303, 413, 422), response.status_code  # 413: over LEASH_MAX_BODY_BYTES
        statuses[response.status_code] += 1

    upload()
    _report("CSV uploads", statuses)


LABELS = st.lists(st.text(max_size=60) | st.sampled_from(["x" * 100_000, "\U0001F600" * 40, "a\nb", "\t", " "]),
                  max_size=30)


def test_huge_and_odd_labels_are_refused_or_fit_the_summary_never_a_5xx(conn):
    statuses: Counter = Counter()
    client = create_app_with().test_client()
    budget = limits()

    @_settings
    @given(labels=LABELS | st.integers(0, 5000).map(lambda n: [f"label {i}" for i in range(n)]))
    def post_labels(labels):
        response = client.post("/jobs", json={**CLASSIFY, "labels": labels})
        _check(response)
        statuses[response.status_code] += 1
        if response.status_code == 202:  # accepted: the largest summary it can produce fits
            worst = {"items": budget.max_items, "labels": dict.fromkeys(labels, budget.max_items),
                     "errors": budget.max_items}
            assert len(labels) <= budget.max_labels and json_size(worst) <= budget.max_summary_bytes

    post_labels()
    _report("labels", statuses)


# rq-dashboard's routes, logged in, with every path segment drawn from values its views parse
# (numbers, registries, orders, job ids) and values they do not expect. Seeded: a failure names
# the request, and the same seed repeats it.
DASHBOARD_ROUTES = [
    ("GET", "/rq/{i}/"), ("GET", "/rq/{i}/view"), ("GET", "/rq/{i}/view/queues"), ("GET", "/rq/{i}/view/workers"),
    ("GET", "/rq/{i}/view/jobs"), ("GET", "/rq/{i}/view/jobs/{q}/{r}/{n}/{o}/{n}"), ("GET", "/rq/{i}/view/job/{j}"),
    ("GET", "/rq/{i}/data/queues.json"), ("GET", "/rq/{i}/data/workers.json"), ("GET", "/rq/{i}/data/job/{j}.json"),
    ("GET", "/rq/{i}/data/jobs/{q}/{r}/{n}/{o}/{n}.json"), ("POST", "/rq/job/{j}/delete"),
    ("POST", "/rq/job/{j}/requeue"), ("POST", "/rq/requeue/{q}"), ("GET", "/rq/requeue/{q}"),
    ("POST", "/rq/queue/{q}/{r}/empty"), ("POST", "/rq/queue/{q}/compact"), ("GET", "/rq/favicon.ico"),
    ("GET", "/rq/static/{j}"),
]
ODD_SEGMENTS = ["", "0", "00", "1", "-1", "8", "100000000", "99999999999999999999", "x", "1e3", " 1", "%00", "%ff",
                "%2F", "é", "..", "a" * 300, "\u0663", "²", "nan", "leash", "queued", "failed", "started",
                "finished", "scheduled", "deferred", "canceled", "asc", "dsc", "null", "{}", "rq:job:x"]
DASHBOARD_REQUESTS = 4000


def test_rq_dashboard_routes_never_get_a_5xx(conn):
    import random
    from urllib.parse import quote

    from tests.web_support import basic

    seed = 20261201
    pick = random.Random(seed)
    client = create_app_with(LEASH_DASHBOARD_USER="ops", LEASH_DASHBOARD_PASSWORD="ops-password-123").test_client()
    auth = basic("ops", "ops-password-123")
    queued = client.post("/jobs", json=CLASSIFY).get_json()["job_id"]
    client.get("/rq/", headers=auth)
    token = client.get_cookie("_csrf_token", path="/rq").value
    statuses: Counter = Counter()
    for n in range(DASHBOARD_REQUESTS):
        method, template = pick.choice(DASHBOARD_ROUTES)

        def segment(kind: str) -> str:
            if kind == "i" and pick.random() < 0.7:
                return "0"
            if kind == "j" and pick.random() < 0.3:
                return queued
            return quote(pick.choice(ODD_SEGMENTS), safe="%")

        path = template.format(i=segment("i"), q=segment("q"), r=segment("r"), n=segment("n"), o=segment("o"),
                               j=segment("j"))
        headers = {**auth, "Accept": pick.choice(["application/json", "text/html", "*/*"])}
        if method == "POST":
            headers["X-CSRFToken"] = token
        response = client.open(path, method=method, headers=headers)
        assert response.status_code < 500, (seed, n, method, path, response.status_code, response.data[:300])
        statuses[response.status_code] += 1
    _report("rq-dashboard routes", statuses)
