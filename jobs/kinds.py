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
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .backends import get_backend
from .context import JobContext, validate_concurrency
from .errors import InvalidJob, ItemError

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
        modules = [os.environ.get("LEASH_IMPORTS", "")]
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


def validate_items(payload: dict, max_items: int = MAX_ITEMS, max_chars: int = MAX_ITEM_CHARS) -> list[str]:
    validate_concurrency(payload)
    items = payload.get("items")
    if not isinstance(items, list):
        raise InvalidJob("'items' must be a list of strings")
    if not items:
        raise InvalidJob("'items' is empty; give at least one item")
    if len(items) > max_items:
        raise InvalidJob(f"too many items: {len(items)} (at most {max_items})")
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise InvalidJob(f"items[{i}] must be a string, got {type(item).__name__}")
        if len(item) > max_chars:
            raise InvalidJob(f"items[{i}] is {len(item)} characters long (at most {max_chars})")
    return items


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
    backend = get_backend(ctx)
    labels = payload["labels"]
    results = ctx.for_each(payload["items"], _item_or_error(lambda text: backend.classify(text, labels)))
    answered = [r for r in results if not _is_error(r)]
    return {"items": len(results), "labels": dict(Counter(answered)), "errors": len(results) - len(answered)}


@classify.validator
def _validate_classify(payload: dict) -> int:
    labels = payload.get("labels")
    if not isinstance(labels, list) or not labels or not all(isinstance(x, str) and x.strip() for x in labels):
        raise InvalidJob("'labels' must be a non-empty list of non-empty strings")
    if len(set(labels)) != len(labels):
        raise InvalidJob("'labels' contains duplicates")
    return len(validate_items(payload))


@kind("prompt")
def prompt(ctx: JobContext, payload: dict) -> dict[str, Any]:
    """The template, with ``{item}`` replaced by each item, sent to the configured backend;
    each completion is stored as that item's result."""
    backend = get_backend(ctx)
    template = payload["template"]
    # str.replace, not str.format: braces elsewhere in a template (JSON examples) are text.
    complete = _item_or_error(lambda item: backend.complete(template.replace("{item}", item)))
    results = ctx.for_each(payload["items"], complete)
    answered = [r for r in results if not _is_error(r)]
    return {"items": len(results), "errors": len(results) - len(answered),
            "characters": sum(len(r) for r in answered)}


@prompt.validator
def _validate_prompt(payload: dict) -> int:
    template = payload.get("template")
    if not isinstance(template, str) or not template.strip():
        raise InvalidJob("'template' must be a non-empty string containing {item}")
    if "{item}" not in template:
        raise InvalidJob("'template' must contain {item}, where each item goes")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise InvalidJob(f"'template' is {len(template)} characters long (at most {MAX_TEMPLATE_CHARS})")
    return len(validate_items(payload))
