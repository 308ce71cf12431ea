"""What one job may cost: the checks behind the limits in ``config.limits()``.

Every check runs before anything is written, and every rejection is an ``InvalidJob`` whose
message names the field, the limit and the setting that raises it, e.g.
``too many items: 1200 (at most 1000, LEASH_MAX_ITEMS)``. The web app answers them with a
422 (a 400 when a required field is missing altogether).

Sizes are counted the way they are stored: a payload or summary as compact JSON with
non-ASCII characters escaped (as the job hash holds a summary; RQ's JSON serializer adds a
space per separator), strings in characters.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from jobs.config import limits
from jobs.core import text
from jobs.core.running.items import CONCURRENCY_FIELD
from jobs.errors import InvalidJob
from jobs.models import structured


def json_size(value: Any) -> int:
    """Bytes of ``value`` as stored: compact JSON, non-ASCII escaped."""
    return len(json.dumps(value, separators=(",", ":"), allow_nan=False))


def nesting_depth(value: Any) -> int:
    """How deeply lists and objects nest (a scalar is 0), without recursion: the value may
    be nested far deeper than Python's stack allows."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        node, depth = pending.pop()
        if isinstance(node, dict):
            children: Iterable[Any] = node.values()
        elif isinstance(node, list | tuple):
            children = node
        else:
            deepest = max(deepest, depth)
            continue
        deepest = max(deepest, depth + 1)
        pending.extend((child, depth + 1) for child in children)
    return deepest


def check_payload(payload: Any) -> None:
    """An object, nested at most LEASH_MAX_PAYLOAD_DEPTH levels, JSON-serialisable and at most
    LEASH_MAX_PAYLOAD_BYTES bytes as stored."""
    if not isinstance(payload, dict):
        raise InvalidJob("the payload must be a JSON object")
    limit = limits()
    depth = nesting_depth(payload)
    if depth > limit.max_payload_depth:
        raise InvalidJob(f"the payload nests {depth} levels deep (at most {limit.max_payload_depth}, "
                         "LEASH_MAX_PAYLOAD_DEPTH)")
    text.check(payload)  # lone surrogates: not text any output could write
    try:
        size = json_size(payload)
    except (TypeError, ValueError) as exc:
        raise InvalidJob(f"the payload is not JSON-serialisable: {exc}") from None
    if size > limit.max_payload_bytes:
        raise InvalidJob(f"the payload is {size} bytes as JSON (at most {limit.max_payload_bytes}, "
                         "LEASH_MAX_PAYLOAD_BYTES): send fewer or shorter items, or split the batch")


#: Payload fields every kind with items accepts: how many items may run at once (jobs/core/running/items.py),
#: what the job may spend (jobs/usage/budget.py), whether its items go through the provider's
#: batch API (jobs/batch/run.py), whether it uses the request cache (jobs/models/cache.py) and
#: where its items come from when another job's results are its items (jobs/read/selection.py).
ITEM_OPTIONS = ("item_concurrency", "budget", "mode", "cache", "max_item_errors", "items_from")


def check_cache_option(payload: dict) -> None:
    """``cache``: true (the default) or false (the job neither reads nor writes the request cache)."""
    if "cache" in payload and not isinstance(payload["cache"], bool):
        raise InvalidJob(f"'cache' must be true or false, got {json.dumps(payload['cache'])[:60]}")


def check_fields(payload: dict, known: Iterable[str]) -> None:
    """Fields a kind does not read are refused, never stored."""
    known = tuple(dict.fromkeys((*known, *ITEM_OPTIONS)))  # a kind may name an item option too: once
    unknown = sorted(name for name in payload if name not in set(known))
    if unknown:
        shown = ", ".join(repr(name[:40]) for name in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
        raise InvalidJob(f"unknown field{'s' if len(unknown) > 1 else ''} {shown}: this kind reads only "
                         f"{', '.join(repr(name) for name in known)} (and the options 'kind', 'max_attempts', 'queue')")


def check_items(payload: dict, max_items: int | None = None, max_chars: int | None = None) -> list[str]:
    """A non-empty list of at most LEASH_MAX_ITEMS strings of at most LEASH_MAX_ITEM_CHARS
    characters each."""
    limit = limits()
    max_items = limit.max_items if max_items is None else max_items
    max_chars = limit.max_item_chars if max_chars is None else max_chars
    items = payload.get("items")
    if not isinstance(items, list):
        raise InvalidJob("'items' must be a list of strings")
    if not items:
        raise InvalidJob("'items' is empty; give at least one item")
    if len(items) > max_items:
        raise InvalidJob(f"too many items: {len(items)} (at most {max_items}, LEASH_MAX_ITEMS): "
                         "split the batch into several jobs")
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise InvalidJob(f"items[{i}] must be a string, got {type(item).__name__}")
        if len(item) > max_chars:
            raise InvalidJob(f"items[{i}] is {len(item)} characters long (at most {max_chars}, "
                             "LEASH_MAX_ITEM_CHARS)")
    return items


def over_long_items(items: list[str]) -> tuple[list[int], int]:
    """The indexes of the items longer than LEASH_MAX_ITEM_CHARS, and that limit: items a job
    takes from another job's results as it starts (``items_from``), which the door never saw."""
    max_chars = limits().max_item_chars
    return [i for i, item in enumerate(items) if len(item) > max_chars], max_chars


def over_long_item_error(max_chars: int) -> str:
    """The error an item taken from another job's results stores when it is longer than a
    submitted item may be: no call is made for it (the price promised none so long)."""
    return f"longer than the {max_chars:,} characters an item may have (LEASH_MAX_ITEM_CHARS): not asked"


def check_labels(payload: dict) -> list[str]:
    """At most LEASH_MAX_LABELS distinct printable labels of at most LEASH_MAX_LABEL_CHARS
    characters. The job's summary counts items per label, so the labels must also fit in
    LEASH_MAX_SUMMARY_BYTES however many items there are."""
    limit = limits()
    labels = payload.get("labels")
    if not isinstance(labels, list) or not labels or not all(isinstance(x, str) and x.strip() for x in labels):
        raise InvalidJob("'labels' must be a non-empty list of non-empty strings")
    if len(labels) > limit.max_labels:
        raise InvalidJob(f"too many labels: {len(labels)} (at most {limit.max_labels}, LEASH_MAX_LABELS)")
    for i, label in enumerate(labels):
        if len(label) > limit.max_label_chars:
            raise InvalidJob(f"labels[{i}] is {len(label)} characters long (at most {limit.max_label_chars}, "
                             "LEASH_MAX_LABEL_CHARS)")
        if not label.isprintable():
            raise InvalidJob(f"labels[{i}] contains a control character (a line break, tab, ...)")
    if len(set(labels)) != len(labels):
        raise InvalidJob("'labels' contains duplicates")
    # The largest summary these labels can produce: every label counted max_items times.
    worst = {"items": limit.max_items, "labels": dict.fromkeys(labels, limit.max_items), "errors": limit.max_items}
    if json_size(worst) > limit.max_summary_bytes:
        raise InvalidJob(f"the labels take {json_size(labels)} bytes as JSON, too many for the job's summary "
                         f"(at most {limit.max_summary_bytes} bytes with a count per label, "
                         "LEASH_MAX_SUMMARY_BYTES; non-ASCII characters take 6-12 bytes): use fewer or shorter labels")
    return labels


def check_instruction(payload: dict) -> str:
    """``reduce``'s instruction: non-empty text within LEASH_MAX_TEMPLATE_CHARS."""
    instruction = payload.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        raise InvalidJob("'instruction' must be a non-empty string: what to make of all the items together")
    limit = limits().max_template_chars
    if len(instruction) > limit:
        raise InvalidJob(f"'instruction' is {len(instruction)} characters long (at most {limit}, "
                         "LEASH_MAX_TEMPLATE_CHARS)")
    return instruction


def check_template(payload: dict) -> str:
    limit = limits()
    template = payload.get("template")
    if not isinstance(template, str) or not template.strip():
        raise InvalidJob("'template' must be a non-empty string containing {item}")
    if "{item}" not in template:
        raise InvalidJob("'template' must contain {item}, where each item goes")
    if len(template) > limit.max_template_chars:
        raise InvalidJob(f"'template' is {len(template)} characters long (at most {limit.max_template_chars}, "
                         "LEASH_MAX_TEMPLATE_CHARS)")
    return template


def check_summary(summary: Any) -> None:
    """A kind's summary must stay small: it is stored in the job's hash and sent with every
    status answer. Per-item results have their own address (``ctx.for_each``)."""
    size = json_size(summary)
    limit = limits().max_summary_bytes
    if size > limit:
        raise InvalidJob(f"the job's summary is {size} bytes as JSON (at most {limit}, LEASH_MAX_SUMMARY_BYTES): "
                         "return per-item results through ctx.for_each and a small summary")


def validate_concurrency(payload: dict) -> None:
    """A job's own concurrency, if it asks for one, is a positive integer."""
    value = payload.get(CONCURRENCY_FIELD)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise InvalidJob(f"'{CONCURRENCY_FIELD}' must be a positive integer, got {value!r}")


# --- an `extract` job: its JSON Schema, template and max_invalid ----------------------------------
def schema_from_text(text: str) -> Any:
    """A form box's or a file's text -> the schema (text that is not JSON stays text: the check names it)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


#: json's messages in words a person reads.
_JSON_PROBLEMS = {
    "Expecting value": "a value is missing or is not JSON (text needs double quotes; true, false and null "
                       "are lower case)",
    "Expecting property name enclosed in double quotes": "a property name needs double quotes "
                                                         "(or a comma is left before a closing brace)",
    "Expecting ',' delimiter": "a comma is missing",
    "Expecting ':' delimiter": "a colon is missing after a property name",
    "Extra data": "there is more after the schema's closing brace",
    "Unterminated string starting at": "a text is not closed with a double quote",
    "Invalid control character at": "a text holds a line break or tab (write \\n or \\t)",
}


def _json_problem(exc: json.JSONDecodeError) -> str:
    return _JSON_PROBLEMS.get(exc.msg, exc.msg[:1].lower() + exc.msg[1:])


def _near(text: str, pos: int) -> str:
    """The text around a position, quoted on one line: where to look."""
    shown = text[max(0, pos - 15):pos + 15].replace("\n", " ").strip()
    return f"near {shown!r}" if shown else "at the end"


def check_schema(payload: dict) -> dict:
    schema = payload.get("schema")
    if schema is None:
        raise InvalidJob("missing field 'schema': give the JSON Schema each answer must follow")
    if isinstance(schema, str):
        if not schema.strip():
            raise InvalidJob("'schema' is empty: give the JSON Schema each answer must follow")
        try:
            json.loads(schema)
        except json.JSONDecodeError as exc:
            # In words, at the spot: "Expecting value: line 1 column 1 (char 0)" says neither.
            raise InvalidJob(f"'schema' is not JSON: {_json_problem(exc)} at line {exc.lineno}, "
                             f"column {exc.colno} ({_near(schema, exc.pos)})") from None
        raise InvalidJob("'schema' must be a JSON object (a JSON Schema), not a string")
    limit = limits()
    size = json_size(schema) if isinstance(schema, dict) else 0
    if size > limit.max_schema_bytes:
        raise InvalidJob(f"'schema' is {size} bytes as JSON (at most {limit.max_schema_bytes}, "
                         "LEASH_MAX_SCHEMA_BYTES)")
    depth = nesting_depth(schema)
    if depth > limit.max_schema_depth:
        raise InvalidJob(f"'schema' nests {depth} levels deep (at most {limit.max_schema_depth}, "
                         "LEASH_MAX_SCHEMA_DEPTH)")
    count = structured.count_properties(schema)
    if count > limit.max_schema_properties:
        raise InvalidJob(f"'schema' declares {count} properties (at most {limit.max_schema_properties}, "
                         "LEASH_MAX_SCHEMA_PROPERTIES)")
    problem = structured.schema_problem(schema)
    if problem:
        raise InvalidJob(f"'schema' {problem}")
    return schema


def check_extract_template(payload: dict) -> str | None:
    """Optional: empty or absent means the default instruction."""
    template = payload.get("template")
    if template is None or (isinstance(template, str) and not template.strip()):
        return None

    return check_template(payload)


def check_max_item_errors(payload: dict) -> None:
    """``max_item_errors``: a count of items (3) or a share ("10%", 0.1); absent: the default."""
    item_error_limit(payload.get("max_item_errors"))


def item_error_limit(value: Any, name: str = "max_item_errors") -> tuple[int | None, float | None]:
    """A count of items (``3``) or a share of them (``"10%"``, ``0.1``) as (count, share);
    (None, None) for no limit (only a job whose every item errored fails)."""
    if value is None or value == "":
        return None, None
    wrong = f"'{name}' must be a count of items (0 or more) or a share like \"10%\", got {json.dumps(value)[:40]}"
    if isinstance(value, bool):
        raise InvalidJob(wrong)
    if isinstance(value, int):
        if value < 0:
            raise InvalidJob(wrong)
        return value, None
    text_ = str(value).strip()
    try:
        if text_.endswith("%"):
            share = float(text_[:-1]) / 100
        elif isinstance(value, float) or "." in text_:
            share = float(text_)
        else:
            return item_error_limit(int(text_), name)
    except ValueError:
        raise InvalidJob(wrong) from None
    if not 0 <= share <= 1:
        raise InvalidJob(f"'{name}' as a share must be between 0 and 1 (0% and 100%), got {json.dumps(value)[:40]}")
    return None, share


def check_max_invalid(payload: dict) -> int:
    value = payload.get("max_invalid")
    if value is None:  # an empty form box
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidJob(f"'max_invalid' must be a count of items (0 or more), got {json.dumps(value)[:40]}")
    return value
