"""The webhook a submission asks for, checked at the door (jobs/enqueue.py): the job's own URL,
else the deployment's LEASH_WEBHOOK_URL. A job's own URL is refused (InvalidJob, a 422) when it is
not an http(s) URL whose host resolves to public addresses only (unless private ones are allowed)
or when the deployment has no secret to sign it with. The deployment's default is the operator's:
it is checked at each delivery only, so a bad default never refuses a submission."""

from __future__ import annotations

from jobs.config.webhook_settings import webhooks
from jobs.errors import InvalidJob
from jobs.webhooks import addresses, signing


def url_for_job(webhook_url) -> str | None:
    """The URL the job's webhook goes to (None: none)."""
    hook = webhooks()
    if webhook_url is None or webhook_url == "":
        return hook.webhook_url
    if not isinstance(webhook_url, str):
        raise InvalidJob("'webhook_url' must be an http:// or https:// URL")
    signing.signer(hook.webhook_secret)  # refused here, not at every delivery, when nothing can sign it
    return addresses.check(webhook_url.strip(), hook.webhook_allow_private).url
