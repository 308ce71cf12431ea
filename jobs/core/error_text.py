"""A failed job's error as its owner reads it (status, job page, ``leash status --full``): the
exception's message and the steps that led to it, each named by its module and function, never
by a file path of the server it ran on. The whole traceback, paths and source lines, goes to
the worker's log (RQ logs every exception a job raises) and to Sentry when configured."""

from __future__ import annotations

import os
import sys
import traceback

#: Steps listed at most (the innermost ones: where it failed).
MAX_STEPS = 8


def _roots() -> list[str]:
    """Where modules are imported from, longest first: a path under one is a module name."""
    roots = {os.path.abspath(p) for p in sys.path if p} | {os.getcwd(), sys.prefix, sys.base_prefix}
    return sorted((r.rstrip(os.sep) + os.sep for r in roots if len(r) > 1), key=len, reverse=True)


def _module(filename: str, roots: list[str]) -> str:
    for root in roots:
        if filename.startswith(root):
            name = filename[len(root):]
            return name[:-3].replace(os.sep, ".") if name.endswith(".py") else name
    return os.path.basename(filename)  # somewhere else: its file name only


def _without_paths(text: str, roots: list[str]) -> str:
    for root in roots:
        text = text.replace(root, "")
    return text


def describe(exc: BaseException) -> str:
    """``Type: message``, then the steps, innermost (the failing one) last."""
    roots = _roots()
    summary = _without_paths(f"{type(exc).__name__}: {exc}".strip(), roots)
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return summary
    steps = [f"  {_module(frame.filename, roots)}.{frame.name}, line {frame.lineno}" for frame in frames]
    if len(steps) > MAX_STEPS:
        steps = [f"  ... {len(steps) - MAX_STEPS} steps before ...", *steps[-MAX_STEPS:]]
    return summary + "\nSteps (the failing one last; the whole traceback is in the worker's log):\n" + "\n".join(steps)
