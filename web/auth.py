"""Who is asking: every job belongs to an owner, and only its owner can see it.

- With ``LEASH_API_TOKENS`` unset (and no trusted header) the deployment is open: every
  caller — browser, curl, the CLI — is the owner ``shared`` (an Authorization header is
  ignored), so a job is visible at the address it prints wherever it was submitted. That is
  for development only.
- Otherwise (production) an owner is signed in one of three ways:
  API callers send ``Authorization: Bearer <token>`` (``LEASH_API_TOKENS`` maps tokens to
  owners); a browser signs in at ``/signin`` with a token and keeps the owner in its signed
  session cookie, with a session id Redis keeps until sign-out (a copied cookie dies with it)
  and a digest of the token (removing the token signs its browsers out); an auth proxy in
  front of the app names the owner in ``LEASH_TRUSTED_USER_HEADER`` (only behind a proxy
  that strips that header from clients: anyone who can send it directly can be anyone).
  Nobody else may act: submitting, cancelling and every other change needs a signed-in owner,
  except the form under ``LEASH_PUBLIC_SUBMIT=1``, where a visitor who is not signed in
  submits as the owner ``public`` (whose jobs every such visitor can open by address).
  A browser session from before sign-in existed keeps a random owner id of its own: it may
  still read the jobs it made, and act no more.

A request authenticated by a cookie (or by the proxy's cookie) can be forged by another site,
so unsafe methods on such requests must carry the CSRF token (see ``csrf_required``). A
bearer token is never sent by a browser on its own, so token requests need none.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from enum import Enum

from flask import current_app, g, request, session
from werkzeug.exceptions import BadRequest, Unauthorized

from jobs.intake import sessions
from jobs.read.owners import OWNER_PATTERN, SHARED_OWNER

from . import app_settings, guessing
from .error_replies import wants_html

log = logging.getLogger(__name__)
_OWNER = OWNER_PATTERN
#: The owner of form submissions by visitors who are not signed in (LEASH_PUBLIC_SUBMIT=1).
PUBLIC_OWNER = "public"
#: Owner ids the app gave anonymous browsers before sign-in existed start with this.
LEGACY_BROWSER_PREFIX = "browser:"


class Need(Enum):
    """What a request is about to do with the owner it asks for."""

    READ = "read"  #: open one job (by its address) or its results
    LIST = "list"  #: list the owner's jobs
    SUBMIT = "submit"  #: the form (LEASH_PUBLIC_SUBMIT lets visitors who are not signed in use it)
    ACT = "act"  #: submit through the API, cancel: any change


class TokenRequired(Unauthorized):
    """401 whose description says what to send; the error handler turns it into JSON."""

    def get_headers(self, environ=None, scope=None):
        return [*super().get_headers(environ, scope), ("WWW-Authenticate", 'Bearer realm="leash"')]


class SignInRequired(TokenRequired):
    """No signed-in owner for what this request does: a browser is sent to the sign-in page
    (web/signin.py), an API client gets the 401."""


def _tokens() -> dict[str, str]:
    return app_settings.current().tokens


def _trusted_header() -> str | None:
    return app_settings.current().web.trusted_user_header or None


def open_mode() -> bool:
    """True in development: no tokens and no proxy, one shared owner."""
    return not _tokens() and not _trusted_header()


def owner_for_token(presented: str) -> str | None:
    # Compare against every token in constant time, so timing does not reveal a prefix.
    found = None
    for token, owner in _tokens().items():
        if hmac.compare_digest(token.encode(), presented.encode()):
            found = owner
    return found


def token_digest(token: str) -> str:
    """What a signed-in session keeps of its token: a keyed digest, so removing the token from
    LEASH_API_TOKENS signs its sessions out, and the (readable) cookie does not carry it."""
    return hmac.new(app_settings.current().secret.encode(), token.encode(), hashlib.sha256).hexdigest()[:32]


def _bearer() -> str | None:
    header = request.headers.get("Authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise TokenRequired("the Authorization header must be 'Bearer <token>'")
    return token.strip()


def _header_owner() -> str | None:
    name = _trusted_header()
    value = request.headers.get(name) if name else None
    if value is None:
        return None
    value = value.strip()
    if not _OWNER.match(value):
        raise BadRequest(f"the {name} header must name an owner: 1-200 letters, digits or _.:@-")
    return value


def start_session(owner: str, token: str) -> None:
    """Sign this browser in: a fresh session (and CSRF token) that Redis keeps for the cookie's
    lifetime; the cookie carries its id, the owner and a digest of the token. Past the owner's
    LEASH_MAX_SESSIONS, its oldest sessions are signed out; the browser's own earlier session ends."""
    lifetime = int(current_app.permanent_session_lifetime.total_seconds())
    # A browser signing in again leaves its session: kept, it would hold one of the owner's
    # LEASH_MAX_SESSIONS places (signing out another browser of theirs) and its cookie's copies.
    end_session()
    session_id, revoked = sessions.start(_redis(), owner, token_digest(token), lifetime,
                                         app_settings.current().web.max_sessions)
    if revoked:
        log.info("owner %r signed in past LEASH_MAX_SESSIONS: its %d oldest session(s) signed out", owner, revoked)
    session.clear()
    session.update(owner=owner, signed_in=token_digest(token), session_id=session_id)
    session.permanent = True


def end_session() -> None:
    """Sign this browser out, and every copy of its cookie with it."""
    owner, session_id = session.get("owner"), session.get("session_id")
    if isinstance(owner, str) and isinstance(session_id, str):
        sessions.end(_redis(), owner, session_id)
    session.clear()


def forget_removed_tokens(app, connection) -> None:
    """At start: drop the sessions of tokens no longer in LEASH_API_TOKENS, so adding a token
    back later does not revive them (each session's token is also checked on every request)."""
    with app.app_context():
        digests: dict[str, set[str]] = {}
        for token, owner in _tokens().items():
            digests.setdefault(owner, set()).add(token_digest(token))
        dropped = sessions.forget_removed_tokens(connection, digests)
    if dropped:
        log.info("signed out %d browser session(s) whose token is no longer in LEASH_API_TOKENS", dropped)


def _redis():
    return current_app.extensions["leash_redis"]


def _session_owner() -> str | None:
    """The owner this browser signed in as, if its token is still one of LEASH_API_TOKENS and
    its session was not ended (sign-out). Asked of Redis once per request."""
    if "leash_session_owner" not in g:
        g.leash_session_owner = _live_session_owner()
    return g.leash_session_owner


def _live_session_owner() -> str | None:
    owner, digest, session_id = session.get("owner"), session.get("signed_in"), session.get("session_id")
    if not isinstance(owner, str) or not isinstance(digest, str) or not isinstance(session_id, str):
        return None  # signed in before sessions were kept server-side: sign in again
    if not any(token_owner == owner and hmac.compare_digest(token_digest(token), digest)
               for token, token_owner in _tokens().items()):
        sessions.end(_redis(), owner, session_id)  # its token was removed: never to come back
        return None
    return owner if sessions.live(_redis(), owner, session_id, digest) else None


def signed_in_owner() -> str | None:
    """The signed-in owner of this request (proxy header, else session), or None."""
    return _header_owner() or _session_owner()


def _legacy_owner() -> str | None:
    owner = session.get("owner")
    if isinstance(owner, str) and owner.startswith(LEGACY_BROWSER_PREFIX) and _OWNER.match(owner) \
            and not session.get("signed_in"):
        return owner
    return None


def browser_owner(need: Need = Need.READ) -> str:
    """The owner a page acts for. In open mode the shared owner (the form, the CLI and curl
    then see the same jobs); otherwise the signed-in owner, else what ``need`` allows a
    visitor who is not signed in, else ``SignInRequired``."""
    if open_mode():
        if session.get("owner") != SHARED_OWNER:
            session["owner"] = SHARED_OWNER
            session.permanent = True
        return _known(SHARED_OWNER)
    owner = signed_in_owner()
    if owner is None and need in (Need.READ, Need.LIST):
        owner = _legacy_owner()
    if owner is None and need in (Need.READ, Need.SUBMIT) and app_settings.current().web.public_submit:
        owner = PUBLIC_OWNER
    if owner is None:
        raise SignInRequired("sign in first: open /signin with your API token"
                             + (" (or submit through the form without signing in)"
                                if app_settings.current().web.public_submit else ""))
    return _known(owner)


def request_owner(need: Need = Need.READ) -> str:
    """The owner of an API request: in open mode the shared owner; else the bearer token's
    owner, else the signed-in owner (proxy header or browser session), else what a page would
    allow a browser for ``need``. Raises 401 with what to send."""
    if open_mode():
        return _known(SHARED_OWNER)
    token = _bearer() if _tokens() else None
    if token is not None:
        guessing.check("token", token, "API tokens")  # a 429 while this address guesses too often
        owner = owner_for_token(token)
        if owner is None:
            guessing.failed("token", token, "API tokens")
            raise TokenRequired("unknown API token; check the token in 'Authorization: Bearer <token>'")
        return _known(owner)
    try:
        return browser_owner(need)
    except SignInRequired:
        if wants_html():
            raise  # a browser (the cancel button) goes to the sign-in page
        raise TokenRequired("missing API token: send 'Authorization: Bearer <token>' "
                            "(tokens are configured in LEASH_API_TOKENS)") from None


def _known(owner: str) -> str:
    g.leash_owner = owner  # for log lines and error reports about this request (web/request_logs.py)
    return owner


def csrf_required() -> bool:
    """True when this request is authenticated by a cookie — its own session, or the auth
    proxy's (the trusted header) — and so must prove it came from our own page."""
    by_token = bool(_tokens()) and "Authorization" in request.headers
    if by_token:
        return False
    by_proxy = bool(_trusted_header()) and _trusted_header() in request.headers
    return by_proxy or isinstance(session.get("owner"), str)
