"""Who owns a job. Every job belongs to one owner and only its owner sees it.

``LEASH_API_TOKENS`` (``alice=<token>,bob=<token>``) maps tokens to owners. Without it the
deployment is open (development): every caller — the CLI, curl, every browser — is the one
owner ``shared``, so a job submitted anywhere is visible at the address it prints.
"""

from __future__ import annotations

import re

#: The owner of every caller in open mode (no LEASH_API_TOKENS).
SHARED_OWNER = "shared"
OWNER_PATTERN = re.compile(r"^[A-Za-z0-9_.:@-]{1,200}$")


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
        if not OWNER_PATTERN.match(owner):
            raise ValueError(f"LEASH_API_TOKENS owner {owner!r} must be 1-200 letters, digits or _.:@-")
        if len(token) < 16:
            raise ValueError(f"LEASH_API_TOKENS token for {owner!r} is shorter than 16 characters; "
                             "generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'")
        if token in tokens:
            raise ValueError(f"LEASH_API_TOKENS gives the same token to {tokens[token]!r} and {owner!r}")
        tokens[token] = owner
    return tokens
