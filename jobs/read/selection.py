"""A job's items taken from another job's results (``items_from``), read when the job starts,
never copied at submission: all of the source job's items, those whose result is a label, those
whose result has a field of a value, or those that errored. What is read is the source job's
*inputs* (its items as submitted), chosen by their results, from whichever store holds them
(Redis, or the SQL archive once their copy left it: ``jobs.read.results.chosen_items``).

    {"job": "<id>"}                                   every item
    {"job": "<id>", "label": "negative"}              result == "negative" (classify)
    {"job": "<id>", "field": "sentiment", "value": "negative"}   result["sentiment"] == "negative"
    {"job": "<id>", "errored": true}                  results stored as {"error": ...}

With ``"results": true`` (beside any of the above) the job takes the chosen items' *results*
instead of their inputs: a result that is text as it is, any other (an extract's object) as its
JSON; an item without a result gives nothing, nor does one that errored (its result is an
error, not an answer) unless ``errored`` chose it. A ``reduce`` job over a ``classify`` job's
negative reviews' extracted fields reads ``{"job": "<extract job>", "results": true}``.

The job waits for its source (``after``) and its items are read as it starts; a job resumed from
its checkpoint reads the same list again (the source has ended: its results no longer change).
"""

from __future__ import annotations

import json
from typing import Any

from jobs.errors import InvalidJob

FIELD = "items_from"
_KEYS = {"job", "label", "field", "value", "errored", "results"}
#: The selector that takes the source job's results rather than its inputs.
RESULTS = "results"


def parse(value) -> dict | None:
    """The selection, checked for its form (None: the payload has none); InvalidJob otherwise."""
    if value is None:
        return None
    if isinstance(value, str):
        value = {"job": value}
    if not isinstance(value, dict) or not isinstance(value.get("job"), str) or not 0 < len(value["job"]) <= 200:
        raise InvalidJob("'items_from' must be {\"job\": \"<job id>\"} and at most one of \"label\", "
                         "\"field\" with \"value\", or \"errored\": true")
    unknown = sorted(set(value) - _KEYS)
    if unknown:
        raise InvalidJob(f"'items_from' has no field {unknown[0]!r}: it takes job, label, field, value, errored, "
                         "results")
    ways = [k for k in ("label", "field", "errored") if k in value]
    if len(ways) > 1:
        raise InvalidJob("'items_from' chooses items one way: label, field and value, or errored")
    if "label" in value and not isinstance(value["label"], str):
        raise InvalidJob("'items_from' label must be a string")
    if "field" in value and (not isinstance(value["field"], str) or "value" not in value):
        raise InvalidJob("'items_from' field must be a string, with the value it must have")
    if "value" in value and "field" not in value:
        raise InvalidJob("'items_from' value goes with a field")
    if "errored" in value and value["errored"] is not True:
        raise InvalidJob("'items_from' errored must be true")
    if RESULTS in value and value[RESULTS] is not True:
        raise InvalidJob("'items_from' results must be true (it takes the results instead of the inputs)")
    return value


def from_text(text: str) -> dict:
    """``leash submit --items-from JOB[:results][:label=VALUE | :FIELD=VALUE | :errored]``."""
    job, _, rest = text.partition(":")
    took = {"job": job}
    if rest == RESULTS or rest.startswith(RESULTS + ":"):
        took[RESULTS] = True
        rest = rest[len(RESULTS) + 1:]
    if not rest:
        return took
    if rest == "errored":
        return {**took, "errored": True}
    name, equals, wanted = rest.partition("=")
    if not equals:
        raise InvalidJob(f"'items_from' must be JOB, JOB:label=VALUE, JOB:FIELD=VALUE or JOB:errored, each may "
                         f"start JOB:results (the results, not the inputs), got {text!r}")
    return {**took, "label": wanted} if name == "label" else {**took, "field": name, "value": wanted}


def chosen(selection: dict, result: Any) -> bool:
    """Whether an item whose result is ``result`` is one the selection takes."""
    errored = _errored(result)
    if selection.get("errored"):
        return errored
    if "label" in selection:
        return not errored and result == selection["label"]
    if "field" in selection:
        return (not errored and isinstance(result, dict)
                and _text(result.get(selection["field"])) == _text(selection["value"]))
    return True


def _errored(result: Any) -> bool:
    return isinstance(result, dict) and "error" in result


def _text(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


def taken(selection: dict, item: Any, result: Any) -> str | None:
    """What the job takes of one chosen item of the source: its input, or with ``results`` its
    result (text as it is, anything else as JSON); None: nothing."""
    if not selection.get(RESULTS):
        return item if isinstance(item, str) else None
    if result is None:
        return None
    if _errored(result) and not selection.get("errored"):
        return None  # an error is not an answer: only ``errored`` takes it (as its JSON)
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)


def describe(selection: dict) -> str:
    how = ("that errored" if selection.get("errored") else f"labeled {selection['label']!r}" if "label" in selection
           else f"whose {selection['field']} is {selection['value']!r}" if "field" in selection else "")
    what = "the results of the items" if selection.get(RESULTS) else "the items"
    return f"{what} of job {selection['job']} {how}".rstrip()
