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


#: Put before each text of a reduce call: ``[3]``, so the model sees where one ends.
REDUCE_MARK = "[{n}] "


def reduce_messages(instruction: str, texts: list[str], partial: bool) -> list[dict]:
    """One call of ``reduce``: the instruction over the texts, numbered. A partial call (one
    chunk of many) is told its answer will be combined with the others' (jobs/core/running/chunk_tree.py)."""
    role = ("You are given some of many texts. Answer the instruction for these texts only, keeping every "
            "detail a later step needs to combine your answer with the answers for the other texts."
            if partial else "Answer the instruction for all the texts together, in one answer.")
    listing = "\n\n".join(REDUCE_MARK.format(n=n) + text for n, text in enumerate(texts, 1))
    return [{"role": "system", "content": f"{role}\nInstruction: {instruction}"},
            {"role": "user", "content": listing}]
