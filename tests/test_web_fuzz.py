"""Property: whatever is posted to the API, the answer is never a 5xx, and every error is
JSON with a non-empty message."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.web_support import CLASSIFY, make_app

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
    client = make_app().test_client()
    _check(client.post("/jobs", data=json.dumps(body), headers={"Content-Type": "application/json", **headers}))


@_settings
@given(raw=st.binary(max_size=300) | st.text(max_size=300).map(str.encode), content_type=CONTENT_TYPES,
       headers=HEADERS)
def test_random_bytes_and_content_types_never_get_a_5xx(conn, raw, content_type, headers):
    client = make_app().test_client()
    _check(client.post("/jobs", data=raw, headers={"Content-Type": content_type, **headers}))


@_settings
@given(path=st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=0x2FF, exclude_characters="?#"),
                    min_size=1, max_size=60),
       query=st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="#"), max_size=40))
def test_random_job_ids_and_query_strings_never_get_a_5xx(conn, path, query):
    client = make_app().test_client()
    for url in (f"/jobs/{path}", f"/jobs/{path}/result?{query}", f"/jobs?{query}"):
        _check(client.get(url))
    _check(client.post(f"/jobs/{path}/cancel"))
