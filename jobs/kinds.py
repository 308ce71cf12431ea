"""Job kinds: a name, a validator run before anything is written, and the function.

To add a kind::

    @kind("summarise")
    def summarise(ctx: JobContext, payload: dict) -> dict: ...

    @summarise.validator
    def _(payload: dict) -> int:  # returns the number of items (total)
        ...
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jobs import config
from jobs.errors import InvalidJob, ItemError
from jobs.intake.limits import check_fields, check_items, check_labels, check_template, validate_concurrency

if TYPE_CHECKING:
    from jobs.core.context import JobContext

# The defaults of LEASH_MAX_ITEMS, LEASH_MAX_ITEM_CHARS and LEASH_MAX_TEMPLATE_CHARS;
# config.limits() has the values in force.
MAX_ITEMS = 1000
MAX_ITEM_CHARS = 10_000
MAX_TEMPLATE_CHARS = 20_000


@dataclass
class Kind:
    name: str
    func: Callable[[JobContext, dict], dict]
    validate: Callable[[dict], int] = lambda payload: 0

    def validator(self, fn: Callable[[dict], int]) -> Callable[[dict], int]:
        self.validate = fn
        return fn


KINDS: dict[str, Kind] = {}


def kind(name: str) -> Callable[[Callable], Kind]:
    def register(func: Callable[[JobContext, dict], dict]) -> Kind:
        KINDS[name] = Kind(name, func)
        return KINDS[name]

    return register


_env_imported = False


def _import_from_env() -> None:
    global _env_imported
    _env_imported = True
    import_kinds()


def import_kinds(modules: list[str] | tuple[str, ...] | None = None) -> None:
    """Import the modules that register job kinds (``--import`` / ``LEASH_IMPORTS``)."""
    if modules is None:
        modules = [config.get("LEASH_IMPORTS")]
    for spec in modules:
        for name in spec.split(","):
            if name.strip():
                importlib.import_module(name.strip())


def get(name: str) -> Kind:
    if name not in KINDS and not _env_imported:
        _import_from_env()
    try:
        return KINDS[name]
    except KeyError:
        raise InvalidJob(f"unknown kind {name!r}; known kinds: {', '.join(sorted(KINDS))}") from None


def validate_items(payload: dict, max_items: int | None = None, max_chars: int | None = None) -> list[str]:
    """``payload["items"]``: a non-empty list of strings within LEASH_MAX_ITEMS and
    LEASH_MAX_ITEM_CHARS (or the limits given); raises InvalidJob saying which limit."""
    validate_concurrency(payload)
    return check_items(payload, max_items, max_chars)


def _item_or_error(fn: Callable[[str], Any]) -> Callable[[str], Any]:
    """An item the model cannot answer is stored as {"error": ...}; the job goes on."""

    def run(item: str) -> Any:
        try:
            return fn(item)
        except ItemError as exc:
            return {"error": str(exc)}

    return run


def _is_error(result: Any) -> bool:
    return isinstance(result, dict) and "error" in result


@kind("classify")
def classify(ctx: JobContext, payload: dict) -> dict[str, Any]:
    """One label per item, from the configured backend; an answer outside the labels (after
    one correction) becomes that item's error."""
    backend = ctx.model
    labels = payload["labels"]
    results = ctx.for_each(payload["items"], _item_or_error(lambda text: backend.classify(text, labels)))
    answered = [r for r in results if not _is_error(r)]
    return {"items": len(results), "labels": dict(Counter(answered)), "errors": len(results) - len(answered)}


@classify.validator
def _validate_classify(payload: dict) -> int:
    check_labels(payload)
    total = len(validate_items(payload))
    check_fields(payload, ("items", "labels"))  # after the required ones: a missing field is a 400
    return total


@kind("prompt")
def prompt(ctx: JobContext, payload: dict) -> dict[str, Any]:
    """The template, with ``{item}`` replaced by each item, sent to the configured backend;
    each completion is stored as that item's result."""
    backend = ctx.model
    template = payload["template"]
    # str.replace, not str.format: braces elsewhere in a template (JSON examples) are text.
    complete = _item_or_error(lambda item: backend.complete(template.replace("{item}", item)))
    results = ctx.for_each(payload["items"], complete)
    answered = [r for r in results if not _is_error(r)]
    return {"items": len(results), "errors": len(results) - len(answered),
            "characters": sum(len(r) for r in answered)}


@prompt.validator
def _validate_prompt(payload: dict) -> int:
    check_template(payload)
    total = len(validate_items(payload))
    check_fields(payload, ("items", "template"))
    return total
