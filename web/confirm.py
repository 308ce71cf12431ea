"""A confirm step for the buttons that change a job (Cancel, Replay) that works without
JavaScript: a browser's first POST (no ``confirm`` field) gets a page saying what will happen,
with a form that posts again with ``confirm=yes``. API clients (JSON) act at once, as before."""

from __future__ import annotations

from flask import make_response, render_template, request, url_for

from .error_replies import wants_html

#: What each action does, in the page's words.
ACTIONS = {
    "cancel": ("Cancel this job?", "Cancel job", "danger",
               "A queued job stops at once; a running one at its next heartbeat (within seconds). Items already "
               "done keep their results. A canceled job can be replayed later."),
    "replay": ("Replay this job?", "Replay job", "primary",
               "It runs again from its checkpoint with its attempts counted from 0: items already done stay done; "
               "model calls for the rest are made, and paid for, again."),
    "replay_item_errors": ("Replay this job?", "Replay job", "primary",
                           "It failed because too many of its items ended in an error: those items are asked "
                           "again (model calls made, and paid for, again), with its attempts counted from 0; the "
                           "answered items stay as they are and cost nothing."),
    "replay_errored": ("Retry the errored items?", "Retry the errored items", "primary",
                       "Only the items that ended in an error are asked again (model calls made, and paid for, "
                       "again); the answered items stay as they are and cost nothing."),
}


def needs_confirming() -> bool:
    """A browser's POST without ``confirm=yes``: show the confirm page instead of acting."""
    return wants_html() and request.form.get("confirm") != "yes"


def confirm_page(action: str, fields: dict, endpoint: str, **args):
    title, button, style, explained = ACTIONS[action]
    response = make_response(render_template(
        "confirm.html", action=action, title=title, button=button, style=style, explained=explained, job=fields,
        action_url=url_for(endpoint, job_id=fields["job_id"], **args),
        back=url_for("api.job", job_id=fields["job_id"])))
    response.headers["Cache-Control"] = "no-store"
    return response


#: The operator's actions that ask first (a quiet worker takes no job until it is restarted).
OPERATOR_ACTIONS = {
    "quiet": ("Quiet this worker?", "Quiet worker",
              "It finishes the job it runs and takes no new one until it is restarted (stop it then with "
              "SIGTERM: nothing to hand back). Its queued jobs go to the other workers."),
    "quiet_all": ("Quiet every worker?", "Quiet every worker",
                  "Each worker finishes the job it runs and takes no new one until it is restarted: nothing "
                  "queued runs meanwhile. To hold one queue for a while, pause it instead."),
}


def operator_confirm_page(action: str, worker: str | None, action_url: str):
    title, button, explained = OPERATOR_ACTIONS[action]
    response = make_response(render_template(
        "operator_confirm.html", title=title, button=button, explained=explained, worker=worker,
        action_url=action_url, every=worker is None, back=url_for("overview.overview_page")))
    response.headers["Cache-Control"] = "no-store"
    return response
