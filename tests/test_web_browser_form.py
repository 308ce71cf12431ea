"""In a real browser (headless Chromium, Playwright, against a real web server) at 1280 and
390 px: the form shows one kind's fields at a time, with JavaScript (the choice switches them
in place) and without (links reload it for another kind); the Estimate is a block beside the
buttons (under them on a phone); an empty schema is said in words; an extract job's page shows
its schema. The chromium fixture skips or fails as tests/test_web_browser.py explains."""

from __future__ import annotations

import re

import pytest

from jobs import kinds

pytestmark = pytest.mark.slow

WIDTHS = (1280, 390)
#: The fields each built-in kind declares (jobs/kinds.py), each a box of the form.
KIND_FIELDS = {name: {f.name for f in kinds.KINDS[name].fields} for name in ("classify", "prompt", "extract")}
ALL_FIELDS = {f.name for f, _ in kinds.fields()}


def open_page(chromium, width: int, javascript: bool = True):
    context = chromium.new_context(viewport={"width": width, "height": 900}, java_script_enabled=javascript)
    return context, context.new_page()


def no_sideways_scroll(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


def visible_fields(page) -> set[str]:
    return {name for name in ALL_FIELDS if page.is_visible(f"#{name}-field")}


@pytest.mark.parametrize("width", WIDTHS)
def test_choosing_a_kind_shows_its_fields_only_with_javascript(conn, env, web_server, chromium, width):
    server = web_server()
    context, page = open_page(chromium, width)
    try:
        page.goto(f"{server.url}/")
        assert visible_fields(page) == KIND_FIELDS["classify"]
        for kind, fields in KIND_FIELDS.items():
            page.select_option("#kind", kind)
            assert visible_fields(page) == fields, kind
            assert no_sideways_scroll(page), (kind, width)
        if width == 1280:
            height = page.evaluate("document.getElementById('submit-form').getBoundingClientRect().height")
            assert height < 1300, f"the extract form is {height} px tall"
        # The kind is in the address: a reload keeps it.
        page.reload()
        assert page.input_value("#kind") == "extract" and visible_fields(page) == KIND_FIELDS["extract"]
        # An empty schema is said in words, and the form stays on extract.
        page.fill("#items", "one review\nanother")
        page.click("button.primary")
        page.wait_for_selector("#schema-error")
        assert page.inner_text("#schema-error").startswith("The schema is empty")
        assert visible_fields(page) == KIND_FIELDS["extract"]
    finally:
        context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_without_javascript_the_kind_links_choose_the_fields(conn, env, web_server, chromium, width):
    server = web_server()
    context, page = open_page(chromium, width, javascript=False)
    try:
        page.goto(f"{server.url}/")
        assert visible_fields(page) == KIND_FIELDS["classify"]
        for kind in ("prompt", "extract", "classify"):
            page.click(f"#kind-links a[href='/?kind={kind}']")
            page.wait_for_url(re.compile(rf"kind={kind}"))
            assert visible_fields(page) == KIND_FIELDS[kind] and page.input_value("#kind") == kind
            assert no_sideways_scroll(page)
        page.fill("#labels", "yes, no")
        page.fill("#items", "first\nsecond\nthird")
        page.click("#estimate-button")
        page.wait_for_selector("#estimate")
        assert visible_fields(page) == KIND_FIELDS["classify"]
        assert len(page.locator("#estimate li").all()) >= 2 and "calls" in page.inner_text("#estimate")
    finally:
        context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_the_estimate_sits_beside_the_buttons_and_an_extract_job_shows_its_schema(conn, env, web_server, chromium,
                                                                                  width):
    server = web_server()
    context, page = open_page(chromium, width)
    try:
        page.goto(f"{server.url}/?kind=extract")
        page.fill("#schema", '{"type": "object", "properties": {"product": {"type": "string"}}, '
                             '"required": ["product"], "additionalProperties": false}')
        page.fill("#items", "The kettle broke.\nGreat headphones.")
        page.click("#estimate-button")
        page.wait_for_selector("#estimate")
        buttons = page.locator(".actions .buttons").bounding_box()
        estimate = page.locator("#estimate").bounding_box()
        if width == 1280:
            assert estimate["x"] >= buttons["x"] + buttons["width"], "the estimate is beside the buttons"
            assert estimate["y"] < buttons["y"] + buttons["height"]
        else:
            assert estimate["y"] >= buttons["y"] + buttons["height"], "on a phone it is under them"
        assert no_sideways_scroll(page)
        page.click("button.primary")
        page.wait_for_url(re.compile(r"/jobs/[\w-]+$"))
        assert page.inner_text("#schema summary") == "1 field: product"
        page.click("#schema summary")
        assert '"additionalProperties": false' in page.inner_text("#schema pre")
        assert no_sideways_scroll(page)
    finally:
        context.close()


#: A body limit a test's upload passes, and that upload (two hundred thousand bytes of items).
SMALL_LIMIT = 64 * 1024
BIG_FILE = {"name": "big.txt", "mimeType": "text/plain", "buffer": b"a review of the kettle\n" * 9000}


def _fill_and_upload(page) -> None:
    page.fill("#name", "March reviews")
    page.fill("#labels", "positive, negative")
    page.fill("#items", "typed before the upload")
    page.set_input_files("#items_file", BIG_FILE)


def _kept(page) -> bool:
    return (page.input_value("#name"), page.input_value("#labels"), page.input_value("#items")) == \
        ("March reviews", "positive, negative", "typed before the upload")


def test_an_upload_over_the_body_limit_is_said_on_the_form_keeping_what_was_typed(conn, env, web_server, chromium):
    server = web_server(extra_env={"LEASH_MAX_BODY_BYTES": str(SMALL_LIMIT)})
    context, page = open_page(chromium, 1280)
    posts: list[str] = []
    page.on("request", lambda request: posts.append(request.url) if request.method == "POST" else None)
    try:
        page.goto(f"{server.url}/")
        _fill_and_upload(page)
        page.click("button.primary")
        page.wait_for_selector("#too-large", state="visible")
        said = page.inner_text("#too-large")
        size = len(BIG_FILE["buffer"])
        assert f"big.txt ({size / 1024:.1f} KB)" in said and "the limit is 64.0 KB (LEASH_MAX_BODY_BYTES)" in said, said
        assert "Nothing was sent" in said and posts == [] and page.url == f"{server.url}/"
        assert _kept(page) and page.evaluate("document.getElementById('items_file').files.length") == 1
        # A smaller file goes: the note leaves and the job is written.
        page.set_input_files("#items_file", {"name": "small.txt", "mimeType": "text/plain", "buffer": b"one\ntwo\n"})
        page.click("button.primary")
        page.wait_for_url(re.compile(r"/jobs/[\w-]+$"))
    finally:
        context.close()


def test_without_javascript_an_upload_over_the_limit_gets_a_page_with_its_size_and_back_keeps_the_form(
        conn, env, web_server, chromium):
    server = web_server(extra_env={"LEASH_MAX_BODY_BYTES": str(SMALL_LIMIT)})
    context, page = open_page(chromium, 1280, javascript=False)
    try:
        page.goto(f"{server.url}/")
        _fill_and_upload(page)
        with page.expect_navigation():
            page.click("button.primary")
        said = page.inner_text("#too-large")
        assert re.search(r"The request body is [\d,]+ bytes, over the limit of 65536 bytes \(LEASH_MAX_BODY_BYTES\)",
                         said), said
        assert "Back button" in page.content()
        page.go_back()
        assert _kept(page)
    finally:
        context.close()
