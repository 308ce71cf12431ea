"""Loads the Lua scripts in ``jobs/lua/`` (one file per script; files starting with ``_`` hold
shared helpers) and runs them with their keys passed by name.

Each script's first line declares its keys, in KEYS[1..n] order::

    -- KEYS: job leases history queued running succeeded failed expiries

A last name ending in ``...`` (``jobs...``) takes a list: the variable tail of KEYS. ``run``
orders the mapping it is given by that line, so a key can be neither left out, added, nor put
in the wrong place: each is an error naming the script and the key, raised before Redis is
called. Scripts are registered per Redis client and called through redis-py's ``Script``
objects (EVALSHA, falling back to EVAL after a Redis restart flushed the script cache).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from redis import Redis
from redis.commands.core import Script

LUA_DIR = Path(__file__).parents[1] / "lua"

#: Every script's text, read once at import: a running process never reads the files again,
#: so installing another release over this one (in place) cannot change what it runs.
_FILES = {path.stem: path.read_text() for path in LUA_DIR.glob("*.lua")}

KEYS_LINE = re.compile(r"-- KEYS: ([a-z0-9_ .]+)")
_NAME = re.compile(r"[a-z][a-z0-9_]*(\.\.\.)?")


def source(name: str) -> str:
    """A script's text, after the shared helpers in ``_lib.lua`` (Redis scripts cannot import)."""
    return _FILES["_lib"] + "\n" + _FILES[name]


def names() -> list[str]:
    return sorted(name for name in _FILES if not name.startswith("_"))


def declared_keys(name: str) -> tuple[str, ...]:
    """The key names a script's first line declares, in KEYS order (a variadic last one keeps
    its ``...``). ValueError for a script without that line, or with a malformed one."""
    first = _FILES[name].split("\n", 1)[0]
    match = KEYS_LINE.fullmatch(first.rstrip())
    if not match:
        raise ValueError(f"{name}: its first line declares no keys ('-- KEYS: name name ...')")
    declared = tuple(match.group(1).split())
    for position, key in enumerate(declared, 1):
        if not _NAME.fullmatch(key) or (key.endswith("...") and position != len(declared)):
            raise ValueError(f"{name}: bad key name {key!r} in its KEYS line")
    if len(set(declared)) != len(declared):
        raise ValueError(f"{name}: a key name is declared twice in its KEYS line")
    return declared


_declared: dict[str, tuple[str, ...]] = {}


def ordered_keys(name: str, given: Mapping[str, Any]) -> list[str]:
    """KEYS for ``name`` from ``given`` (key name -> key, a list for a variadic name), in the
    order the script declares; TypeError for a positional list, a missing or an extra key."""
    if not isinstance(given, Mapping):
        raise TypeError(f"{name}: keys are passed by name (a mapping), not as a {type(given).__name__}")
    declared = _declared.get(name)
    if declared is None:
        declared = _declared[name] = declared_keys(name)
    ordered: list[str] = []
    for key in declared:
        variadic = key.endswith("...")
        bare = key[:-3] if variadic else key
        if bare not in given:
            raise TypeError(f"{name}: missing key {bare!r}")
        value = given[bare]
        if variadic:
            if not isinstance(value, list | tuple):
                raise TypeError(f"{name}: key {bare!r} takes a list, got a {type(value).__name__}")
            ordered.extend(value)
        elif isinstance(value, str | bytes):
            ordered.append(value)
        else:
            raise TypeError(f"{name}: key {bare!r} takes one key name, got a {type(value).__name__}")
    if len(given) != len(declared):
        extra = sorted(set(given) - {key.removesuffix("...") for key in declared})
        raise TypeError(f"{name}: unexpected key {extra[0]!r}")
    return ordered


_registered: dict[tuple[int, str], Script] = {}


def script(connection: Redis, name: str) -> Script:
    """The registered script, called with positional KEYS (tests run older releases' scripts so)."""
    key = (id(connection), name)
    registered = _registered.get(key)
    if registered is None or registered.registered_client is not connection:
        registered = connection.register_script(source(name))
        _registered[key] = registered
    return registered


def run(connection: Redis, name: str, keys: Mapping[str, Any], args: list[Any], pipeline=None) -> Any:
    """Run ``name`` with ``keys`` by name (see ``ordered_keys``); with ``pipeline``, queued on it."""
    ordered = ordered_keys(name, keys)  # checked before the script is registered or sent
    return script(connection, name)(keys=ordered, args=args, client=pipeline)
