"""The offline ``local`` backend is a newcomer's first result: its labels must look plausible
(stems, negation, a neutral label when nothing hints), and stay deterministic."""

from __future__ import annotations

import pytest

from jobs.models.backends import LocalBackend

SENTIMENT = ["positive", "negative"]


@pytest.mark.parametrize(("text", "labels", "label"), [
    ("It crashes", SENTIMENT, "negative"),
    ("The app crashed twice today", SENTIMENT, "negative"),
    ("Not good at all", SENTIMENT, "negative"),
    ("The issues keep coming", SENTIMENT, "negative"),
    ("Thanks, the fix worked", SENTIMENT, "positive"),
    ("I like it", SENTIMENT, "positive"),
    ("It is a chair", [*SENTIMENT, "neutral"], "neutral"),
    ("How do I export my data?", [*SENTIMENT, "question"], "question"),
    ("Login freezes on the second screen", ["feature request", "bug"], "bug"),
])
def test_the_local_backend_labels_plausibly(text, labels, label):
    backend = LocalBackend(delay_ms=0)
    assert backend.classify(text, labels) == label
    assert backend.classify(text, labels) == label, "the same text gets the same label"
