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
from .context import JobContext
from .errors import InvalidJob, PermanentError

MAX_ITEMS = 1000
MAX_ITEM_CHARS = 10_000


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


@kind("classify")
def classify(ctx: JobContext, payload: dict) -> dict[str, Any]:
    """One label per item, from the configured backend."""
    backend = get_backend()
    labels = payload["labels"]
    results = ctx.for_each(payload["items"], lambda text: backend.classify(text, labels))
    bad = [r for r in results if r not in labels]
    if bad:
        raise PermanentError(f"backend {backend.name} answered labels outside {labels}: {bad[:3]}")
    return {"items": len(results), "labels": dict(Counter(results))}


@classify.validator
def _validate_classify(payload: dict) -> int:
    labels = payload.get("labels")
    if not isinstance(labels, list) or not labels or not all(isinstance(x, str) and x.strip() for x in labels):
        raise InvalidJob("'labels' must be a non-empty list of non-empty strings")
    if len(set(labels)) != len(labels):
        raise InvalidJob("'labels' contains duplicates")
    return len(validate_items(payload))
