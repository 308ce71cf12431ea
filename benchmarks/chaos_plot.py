"""Draws the chaos run's job states over time (one line per state, one mark per disruption)."""

from __future__ import annotations

from pathlib import Path

COLOURS = {"queued": "tab:blue", "running": "tab:orange", "stale": "tab:red",
           "succeeded": "tab:green", "failed": "tab:gray"}
EVENT_STYLE = {"sigkill": ("black", "-"), "sigterm": ("tab:purple", "--"),
               "sigstop": ("tab:red", ":"), "redis-restart": ("tab:brown", "-."), "sigcont": ("tab:green", ":")}


def plot_states(samples: list[dict], events: list[dict], path: str | Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, zoom) = plt.subplots(2, 1, figsize=(10, 6), dpi=100, sharex=True,
                                   gridspec_kw={"height_ratios": [2, 1]})
    times = [s["t"] for s in samples]
    for state, colour in COLOURS.items():
        ax.plot(times, [s[state] for s in samples], label=state, color=colour, linewidth=1.6)
    # The interesting states are small numbers next to hundreds of jobs: draw them again, alone.
    for state in ("running", "stale"):
        zoom.plot(times, [s[state] for s in samples], label=state, color=COLOURS[state], linewidth=1.4)
    seen = set()
    for event in events:
        if event["kind"] not in EVENT_STYLE:
            continue
        colour, style = EVENT_STYLE[event["kind"]]
        label = event["kind"] if event["kind"] not in seen else None
        seen.add(event["kind"])
        for axis in (ax, zoom):
            axis.axvline(event["t"], color=colour, linestyle=style, linewidth=1, alpha=0.7,
                         label=label if axis is ax else None)
    zoom.set_xlabel("seconds since the first job was enqueued")
    ax.set_ylabel("jobs")
    zoom.set_ylabel("running / stale")
    ax.set_title(title, fontsize=10)
    for axis in (ax, zoom):
        axis.grid(alpha=0.3)
    ax.legend(loc="center right", fontsize=8, ncol=2)
    zoom.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
