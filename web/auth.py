"""Who is asking: every job belongs to an owner, and only its owner can see it.

- API callers send ``Authorization: Bearer <token>``; ``LEASH_API_TOKENS`` maps tokens to
  owners (``alice=s3cret,bob=0ther``). A missing or unknown token is a 401.
- Browser users get a random owner id in the signed session cookie on their first page; it
  is permanent (a bookmarked job page still works weeks later in the same browser).
- With ``LEASH_API_TOKENS`` unset the API is open: callers without a session all share the
  owner ``shared`` (an Authorization header is ignored). That is for development only.

A request authenticated by its cookie can be forged by another site, so unsafe methods on
cookie-authenticated requests must carry the CSRF token (see ``csrf_required``). A bearer
token is never sent by a browser on its own, so token requests need none.
"""

from __future__ import annotations

import hmac
import re
import secrets

from flask import current_app, g, request, session
from werkzeug.exceptions import Unauthorized

#: The owner of every request in open mode (no LEASH_API_TOKENS) that has no session.
SHARED_OWNER = "shared"
_OWNER = re.compile(r"^[A-Za-z0-9_.:@-]{1,200}$")


class TokenRequired(Unauthorized):
    """401 whose description says what to send; the error handler turns it into JSON."""

    def get_headers(self, environ=None, scope=None):
        return [*super().get_headers(environ, scope), ("WWW-Authenticate", 'Bearer realm="leash"')]


def parse_tokens(raw: str | dict | None) -> dict[str, str]:
    """``owner=token,owner2=token2`` -> {token: owner}. Raises ValueError with the fix."""
    if isinstance(raw, dict):
        pairs = list(raw.items())
    else:
        pairs = []
        for part in (raw or "").split(","):
            if not part.strip():
                continue
            owner, sep, token = part.strip().partition("=")
            if not sep:
                raise ValueError(f"LEASH_API_TOKENS entry {owner!r} has no '=': write owner=token,owner2=token2")
            pairs.append((owner.strip(), token.strip()))
    tokens: dict[str, str] = {}
    for owner, token in pairs:
        if not _OWNER.match(owner):
            raise ValueError(f"LEASH_API_TOKENS owner {owner!r} must be 1-200 letters, digits or _.:@-")
        if len(token) < 16:
            raise ValueError(f"LEASH_API_TOKENS token for {owner!r} is shorter than 16 characters; "
                             "generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'")
        if token in tokens:
            raise ValueError(f"LEASH_API_TOKENS gives the same token to {tokens[token]!r} and {owner!r}")
        tokens[token] = owner
    return tokens


def _tokens() -> dict[str, str]:
    return current_app.config["LEASH_TOKENS"]


def _owner_for_token(presented: str) -> str | None:
    # Compare against every token in constant time, so timing does not reveal a prefix.
    found = None
    for token, owner in _tokens().items():
        if hmac.compare_digest(token.encode(), presented.encode()):
            found = owner
    return found


def _bearer() -> str | None:
    header = request.headers.get("Authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise TokenRequired("the Authorization header must be 'Bearer <token>'")
    return token.strip()


def browser_owner() -> str:
    """The session's owner id, created on first use (pages call this)."""
    owner = session.get("owner")
    if not isinstance(owner, str) or not _OWNER.match(owner):
        owner = "browser:" + secrets.token_urlsafe(12)
        session["owner"] = owner
        session.permanent = True
    return _known(owner)


def request_owner() -> str:
    """The owner of an API request: bearer token, else browser session, else (open mode only)
    the shared owner. Raises 401 with what to send."""
    token = _bearer() if _tokens() else None
    if token is not None:
        owner = _owner_for_token(token)
        if owner is None:
            raise TokenRequired("unknown API token; check the token in 'Authorization: Bearer <token>'")
        return _known(owner)
    owner = session.get("owner")
    if isinstance(owner, str) and _OWNER.match(owner):
        return _known(owner)
    if _tokens():
        raise TokenRequired("missing API token: send 'Authorization: Bearer <token>' "
                            "(tokens are configured in LEASH_API_TOKENS)")
    return _known(SHARED_OWNER)


def _known(owner: str) -> str:
    g.leash_owner = owner  # for log lines and error reports about this request (web/observability.py)
    return owner


def csrf_required() -> bool:
    """True when this request is authenticated by its cookie (no Authorization header, a
    session owner) and so must prove it came from our own page."""
    by_token = bool(_tokens()) and "Authorization" in request.headers
    return not by_token and isinstance(session.get("owner"), str)
