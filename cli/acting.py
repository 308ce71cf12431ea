"""Who the command line acts as, and where it points a person at a job.

With ``LEASH_API_TOKENS`` unset (development) the shared owner, the same as curl and the browser,
so ``leash submit`` prints an address that opens anywhere. With tokens set (production) a command
that submits or lists must say whose jobs: ``--owner`` or ``--token``. Commands given a job id act
on that job whoever owns it: Redis access is an operator's access.
"""

from __future__ import annotations

from jobs.config.front import web_app
from jobs.errors import NoSuchJob
from jobs.read import job_status
from jobs.read.owners import OWNER_PATTERN, SHARED_OWNER, parse_tokens

from .exit_codes import BadInput
from .option_defaults import setting_option
from .redis_target import web_url


def owner_option(func):
    func = setting_option("--token", setting="LEASH_TOKEN",
                          help="Act as the owner of this API token (from LEASH_API_TOKENS).")(func)
    return setting_option("--owner", setting="LEASH_OWNER",
                          help="Act as this owner (default without LEASH_API_TOKENS: shared).")(func)


def acting_owner(owner: str | None, token: str | None) -> str:
    try:
        tokens = parse_tokens(web_app().api_tokens)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    if token:
        if not tokens:
            raise BadInput("--token needs LEASH_API_TOKENS, the owner=token list of the deployment")
        found = tokens.get(token)
        if found is None:
            raise BadInput("unknown --token: it is not one of LEASH_API_TOKENS")
        if owner and owner != found:
            raise BadInput(f"--owner {owner!r} and --token (owner {found!r}) disagree; give one of them")
        return found
    if owner:
        if not OWNER_PATTERN.match(owner):
            raise BadInput(f"--owner {owner!r} must be 1-200 letters, digits or _.:@-")
        return owner
    if tokens:
        raise BadInput("LEASH_API_TOKENS is set (production): say whose jobs these are with --owner NAME "
                       "or --token TOKEN (or LEASH_OWNER / LEASH_TOKEN)")
    return SHARED_OWNER


def job_address(job_id: str) -> str:
    return f"{web_url()}/jobs/{job_id}"


def status_or_exit(conn, job_id: str, whole_error: bool = False) -> dict:
    """The job's status: from Redis, else from the archive once Redis no longer holds it."""
    try:
        return job_status.status(conn, job_id, whole_error=whole_error)
    except NoSuchJob:
        raise BadInput(f"no such job: {job_id} (in the Redis at {conn.leash_url}, nor in its archive)") from None
