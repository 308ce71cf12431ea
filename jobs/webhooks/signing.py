"""Signing a webhook as the Standard Webhooks spec says (https://www.standardwebhooks.com), with
its reference library: ``webhook-id`` (the same on every attempt of one delivery),
``webhook-timestamp`` (unix seconds of the attempt) and ``webhook-signature``:
``v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">``. The secret (LEASH_WEBHOOK_SECRET) is
either the spec's form, ``whsec_`` followed by base64, or any other text, used as its UTF-8 bytes."""

from __future__ import annotations

from datetime import UTC, datetime

from standardwebhooks import Webhook

from jobs.errors import InvalidJob

PREFIX = "whsec_"


def signer(secret: str | None) -> Webhook:
    """The spec's signer for a secret; InvalidJob for none, or a ``whsec_`` one that is not base64."""
    if not secret:
        raise InvalidJob("webhooks need LEASH_WEBHOOK_SECRET set on this deployment (the key they are signed with)")
    if secret.startswith(PREFIX):
        try:
            return Webhook(secret)
        except ValueError as exc:  # binascii.Error
            raise InvalidJob(f"LEASH_WEBHOOK_SECRET starts with {PREFIX} but is not base64 after it: {exc}") from None
    return Webhook(secret.encode())


def headers(secret: str | None, delivery_id: str, timestamp: int, body: str) -> dict[str, str]:
    """The three headers of one attempt (and the body's type)."""
    signature = signer(secret).sign(delivery_id, datetime.fromtimestamp(timestamp, UTC), body)
    return {"webhook-id": delivery_id, "webhook-timestamp": str(timestamp), "webhook-signature": signature,
            "content-type": "application/json"}
