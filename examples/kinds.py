"""An example job kind (README.md, "Your own job kinds"): run workers with
``LEASH_IMPORTS=examples.kinds`` in this folder."""

from jobs.errors import InvalidJob
from jobs.kinds import Field, kind


def check_tone(payload):  # runs before anything is written; says what is wrong
    if payload.get("tone") not in ("plain", "formal"):
        raise InvalidJob("'tone' must be plain or formal")


TONE = Field("tone", "Tone", "plain or formal", check=check_tone)


@kind("summarise", fields=(TONE,))
def summarise(ctx, payload):
    # for_each skips items an earlier attempt finished and checkpoints each result as it ends.
    summaries = ctx.for_each(payload["items"], lambda text: ctx.model.complete(
        f"Summarise in a {payload['tone']} tone: {text}"))
    return {"items": len(summaries)}  # a small summary; per-item results have their own address
