"""What ``classify`` asks a model and how its answer names a label: shared by the call loop
(``jobs.models.calls``) and by a batch job's requests (``jobs.kinds``), which import this alone."""

from __future__ import annotations

import re

#: The most tokens ``classify`` asks for: a label is a few words.
CLASSIFY_MAX_TOKENS = 32

_THINKING = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_LIST_MARKER = re.compile(r"^(?:[-*\u2022]|\d+[.)])\s+")


def match_label(answer: str, labels: list[str]) -> str | None:
    """The label an answer names, tolerating case, quotes, a list marker ("- no"), a trailing
    period and a reasoning model's <think> block, or a label that opens a sentence ("No, ice is
    not hot."); None if it names none, or opens with more than one label."""
    cleaned = _THINKING.sub("", answer or "").strip(" \t\r\n\"'`*.")
    cleaned = _LIST_MARKER.sub("", cleaned).strip(" \t\r\n\"'`*.")
    if cleaned in labels:
        return cleaned
    by_lower = {label.lower(): label for label in labels}
    if cleaned.lower() in by_lower:
        return by_lower[cleaned.lower()]
    opening = [label for label in labels
               if re.match(re.escape(label.lower()) + r"[,.;:!\n]", cleaned.lower())]
    return opening[0] if len(opening) == 1 else None


def classify_messages(text: str, labels: list[str]) -> list[dict]:
    """The first call of ``classify`` (also what a batch job sends for the item)."""
    listing = "\n".join(f"- {label}" for label in labels)
    return [
        {"role": "system", "content": "Classify the user's text. Reply with exactly one label from "
                                      f"this list, written as it appears, and nothing else:\n{listing}"},
        {"role": "user", "content": text},
    ]
