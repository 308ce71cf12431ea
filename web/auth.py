"""Who is asking: every job belongs to an owner, and only its owner can see it.

- API callers send ``Authorization: Bearer <token>``; ``LEASH_API_TOKENS`` maps tokens to
  owners (``alice=s3cret,bob=0ther``). A missing or unknown token is a 401.
- Browser users get a random owner id in the signed session cookie on their first page; it
  is permanent (a bookmarked job page still works weeks later in the same browser).
- With ``LEASH_API_TOKENS`` unset the deployment is open: every caller — browser, curl, the
  CLI — is the owner ``shared`` (an Authorization header is ignored), so a job is visible at
  the address it prints wherever it was submitted. That is for development only.

A request authenticated by its cookie can be forged by another site, so unsafe methods on
cookie-authenticated requests must carry the CSRF token (see ``csrf_required``). A bearer
token is never sent by a browser on its own, so token requests need none.
"""

from __future__ import annotations

import hmac
import secrets

from flask import current_app, g, request, session
from werkzeug.exceptions import Unauthorized

from jobs.owners import OWNER_PATTERN, SHARED_OWNER, parse_tokens  # noqa: F401  (parse_tokens: web.app)

_OWNER = OWNER_PATTERN


class TokenRequired(Unauthorized):
    """401 whose description says what to send; the error handler turns it into JSON."""

    def get_headers(self, environ=None, scope=None):
        return [*super().get_headers(environ, scope), ("WWW-Authenticate", 'Bearer realm="leash"')]


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
    """The session's owner id, created on first use (pages call this). In open mode it is the
    shared owner: the form, the CLI and curl then see the same jobs."""
    if not _tokens():
        if session.get("owner") != SHARED_OWNER:
            session["owner"] = SHARED_OWNER
            session.permanent = True
        return _known(SHARED_OWNER)
    owner = session.get("owner")
    if not isinstance(owner, str) or not _OWNER.match(owner) or owner == SHARED_OWNER:
        owner = "browser:" + secrets.token_urlsafe(12)
        session["owner"] = owner
        session.permanent = True
    return _known(owner)


def request_owner() -> str:
    """The owner of an API request: in open mode the shared owner; else the bearer token's
    owner, else the browser session's. Raises 401 with what to send."""
    if not _tokens():
        return _known(SHARED_OWNER)
    token = _bearer()
    if token is not None:
        owner = _owner_for_token(token)
        if owner is None:
            raise TokenRequired("unknown API token; check the token in 'Authorization: Bearer <token>'")
        return _known(owner)
    owner = session.get("owner")
    if isinstance(owner, str) and _OWNER.match(owner) and owner != SHARED_OWNER:
        return _known(owner)
    raise TokenRequired("missing API token: send 'Authorization: Bearer <token>' "
                        "(tokens are configured in LEASH_API_TOKENS)")


def _known(owner: str) -> str:
    g.leash_owner = owner  # for log lines and error reports about this request (web/observability.py)
    return owner


def csrf_required() -> bool:
    """True when this request is authenticated by its cookie (no Authorization header, a
    session owner) and so must prove it came from our own page."""
    by_token = bool(_tokens()) and "Authorization" in request.headers
    return not by_token and isinstance(session.get("owner"), str)
