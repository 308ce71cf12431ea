"""Where a webhook may go: an http(s) URL whose host resolves only to public addresses, unless
the deployment allows private ones (LEASH_WEBHOOK_ALLOW_PRIVATE=1). Checked at the door (the
submission is refused) and again at every delivery, whose connection goes to an address this
check returned: a name that resolves elsewhere between the check and the connection (DNS
rebinding) cannot reach an address the check refused."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from jobs.errors import InvalidJob

#: The longest URL taken (it is kept in the job's record, read by every status poll).
MAX_URL_CHARS = 500


@dataclass(frozen=True)
class Target:
    url: str
    scheme: str
    host: str
    port: int
    path: str  # with its query
    addresses: tuple[str, ...]


def parse(url) -> tuple[str, str, int, str]:
    """(scheme, host, port, path) of a webhook URL; InvalidJob naming what is wrong."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidJob("'webhook_url' must be an http:// or https:// URL")
    if len(url) > MAX_URL_CHARS:
        raise InvalidJob(f"'webhook_url' is {len(url)} characters long; at most {MAX_URL_CHARS}")
    if any(ord(c) <= 32 or ord(c) == 127 for c in url):
        raise InvalidJob("'webhook_url' must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidJob(f"'webhook_url' is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidJob(f"'webhook_url' must be an http:// or https:// URL with a host, got {url[:80]!r}")
    if parts.username is not None or parts.password is not None:
        raise InvalidJob("'webhook_url' must not carry a user name or password (the body is signed instead)")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80), path


def is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def check(url, allow_private: bool) -> Target:
    """The URL's target, every address its host resolves to checked; InvalidJob when the URL is
    malformed, its host does not resolve, or any address is private, loopback, link-local or
    reserved (and the deployment does not allow those)."""
    scheme, host, port, path = parse(url)
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise InvalidJob(f"'webhook_url': the host {host!r} does not resolve ({exc})") from None
    addresses = tuple(dict.fromkeys(info[4][0] for info in found))
    if not addresses:
        raise InvalidJob(f"'webhook_url': the host {host!r} does not resolve")
    if not allow_private:
        private = [a for a in addresses if not is_public(a)]
        if private:
            raise InvalidJob(f"'webhook_url' goes to a private, loopback or reserved address ({private[0]}); "
                             "this deployment sends webhooks to public addresses only "
                             "(LEASH_WEBHOOK_ALLOW_PRIVATE=1 allows others)")
    return Target(url, scheme, host, port, path, addresses)
