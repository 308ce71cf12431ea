"""Where a job kind's model calls go. A backend is a small object with ``classify``; the
offline one below needs no network and is deterministic, so the product works out of the box.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from typing import Protocol

from .config import settings


class Backend(Protocol):
    name: str

    def classify(self, text: str, labels: list[str]) -> str:
        """Return exactly one of ``labels`` for ``text``."""


# Words that hint at common labels; anything else falls back to word overlap, then a hash.
_LEXICON = {
    "positive": {"good", "great", "love", "excellent", "happy", "nice", "awesome", "thanks", "fast", "perfect"},
    "negative": {"bad", "terrible", "hate", "awful", "broken", "slow", "angry", "worst", "refund", "poor"},
    "spam": {"free", "winner", "prize", "click", "offer", "viagra", "lottery", "urgent"},
    "bug": {"error", "crash", "broken", "fails", "exception", "bug", "wrong"},
    "question": {"how", "why", "what", "when", "where", "?"},
}
_WORD = re.compile(r"[a-z0-9']+|\?")


class LocalBackend:
    """Deterministic offline classifier: lexicon and word overlap, ties broken by a hash."""

    name = "local"

    def __init__(self, delay_ms: int | None = None):
        self.delay_s = (settings().local_delay_ms if delay_ms is None else delay_ms) / 1000.0

    def classify(self, text: str, labels: list[str]) -> str:
        if self.delay_s:
            time.sleep(self.delay_s)  # stands in for a model call's latency in demos
        words = set(_WORD.findall(text.lower()))
        best, best_score = None, 0
        for label in labels:
            hints = _LEXICON.get(label.lower(), set()) | set(_WORD.findall(label.lower()))
            score = len(words & hints)
            if score > best_score:
                best, best_score = label, score
        if best is not None:
            return best
        digest = hashlib.sha256(text.encode()).digest()
        return labels[digest[0] % len(labels)]


_BACKENDS = {"local": LocalBackend}


def register(name: str, factory) -> None:
    _BACKENDS[name] = factory


def get_backend() -> Backend:
    name = os.environ.get("LEASH_MODEL_BACKEND", "local")
    try:
        return _BACKENDS[name]()
    except KeyError:
        raise ValueError(f"LEASH_MODEL_BACKEND={name!r} is unknown; choose one of {sorted(_BACKENDS)}") from None
