"""Signing in and out in a browser (production: LEASH_API_TOKENS set).

    GET/POST /signin   a token in, the owner kept in the signed session; then back to ?next=
    POST /signout      forget the owner, and end the session in Redis (copies of the cookie too)

Both forms carry flask-wtf's CSRF token: another site cannot sign a visitor in as someone else
(whose jobs the visitor would then fill) nor out. A page that needs an owner sends a browser
that is not signed in here, with the page it wanted as ``next`` (a path on this site only).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from flask import Blueprint, Flask, redirect, render_template, request, session, url_for
from flask_wtf import FlaskForm
from wtforms import HiddenField, PasswordField
from wtforms.validators import InputRequired

from . import app_settings, auth, guessing
from .error_replies import error_response, wants_html

bp = Blueprint("signin", __name__)


class SignInForm(FlaskForm):
    token = PasswordField("API token", validators=[InputRequired(message="Paste your API token")])
    next = HiddenField()


class SignOutForm(FlaskForm):
    pass


#: A path on this site: one "/" then printable ASCII without spaces, and never "//" or "/\\" at
#: the start, which browsers read as another host (they also drop tabs and line breaks, so
#: "/\t/evil.example" would be "//evil.example": no whitespace at all).
_LOCAL_PATH = re.compile(r"/(?![/\\])[\x21-\x7e]*")


def _local_path(target: str | None) -> str:
    """``target`` if it is a path on this site, else the form: never a redirect elsewhere."""
    if not target or not _LOCAL_PATH.fullmatch(target) or "\\" in target:
        return url_for("pages.index")
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return url_for("pages.index")
    return target


@bp.route("/signin", methods=["GET", "POST"])
def signin():
    if auth.open_mode():
        return redirect(url_for("pages.index"), 303)  # development: everyone is the shared owner
    form = SignInForm()
    if request.method == "GET":
        form.next.data = _local_path(request.args.get("next"))
    status = 200
    if form.validate_on_submit():
        token = form.token.data.strip()
        guessing.check("signin", token, "sign-ins")  # a 429 while this address guesses too often
        owner = auth.owner_for_token(token)
        if owner is not None:
            auth.start_session(owner, token)
            return redirect(_local_path(form.next.data), 303)
        guessing.failed("signin", token, "sign-ins")
        form.token.errors.append("Unknown token: check it, or ask for one (LEASH_API_TOKENS)")
        status = 401
    elif form.is_submitted():
        status = 403 if form.csrf_token.errors else 422  # 403: as every refused CSRF token
    return render_template("signin.html", form=form), status


@bp.post("/signout")
def signout():
    form = SignOutForm()
    if not form.validate_on_submit():
        return error_response(403, "refused: the sign-out form expired or was not sent from this page; reload it")
    auth.end_session()
    return redirect(url_for("signin.signin"), 303)


def _next_for_this_request() -> str:
    if request.method == "GET":
        return request.full_path.rstrip("?")
    # After a refused change, back to the page it was made from (its path only).
    return _local_path(urlsplit(request.referrer or "").path or None)


def init_app(app: Flask) -> None:
    app.register_blueprint(bp)

    @app.errorhandler(auth.SignInRequired)
    def sign_in_first(exc: auth.SignInRequired):
        if wants_html():
            return redirect(url_for("signin.signin", next=_next_for_this_request()), 303)
        headers = dict(exc.get_headers())
        headers.pop("Content-Type", None)
        return error_response(401, exc.description, headers)

    @app.context_processor
    def who():
        """The nav's "signed in as" (never an error: an error page renders this too). Its
        sign-out form only shows a token: it never reads the request's body."""
        try:
            owner = None if auth.open_mode() else auth.signed_in_owner()
        except Exception:  # noqa: BLE001 - a malformed proxy header is answered by the page itself
            owner = None
        return {"leash_owner_mode": not auth.open_mode(), "leash_signed_in": owner,
                "leash_signout_form": SignOutForm(formdata=None) if owner and "owner" in session else None,
                "leash_public_submit": app_settings.current().web.public_submit}
