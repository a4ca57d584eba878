"""``cutline replay --plot FILE``: the checkpoint timeline (durations and outcomes over time).

``CheckpointOutcomes`` folds journal events into one point per ended
checkpoint (pure); ``write_plot`` draws them with matplotlib, as PNG, SVG or
an HTML page with the SVG inline.
"""

from __future__ import annotations

import html
import io
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from events.extras import require
from events.wire.records import (
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointKind,
    CheckpointTriggered,
    JournalEvent,
)


@dataclass(frozen=True, slots=True)
class EndedCheckpoint:
    """How one checkpoint ended: when it was triggered, how long it took, and why it failed."""

    job_id: str
    checkpoint_id: int
    kind: CheckpointKind
    triggered_ms: int
    duration_ms: int
    completed: bool
    reason: str | None = None


class CheckpointOutcomes:
    """Collects an :class:`EndedCheckpoint` per ended checkpoint while a journal streams past."""

    def __init__(self) -> None:
        self._triggered: dict[tuple[str, int], CheckpointTriggered] = {}
        self.outcomes: list[EndedCheckpoint] = []

    def add(self, event: JournalEvent) -> None:
        match event:
            case CheckpointTriggered():
                self._triggered[(event.job_id, event.checkpoint_id)] = event
            case CheckpointCompleted():
                start = self._triggered.pop((event.job_id, event.checkpoint_id), None)
                self.outcomes.append(
                    EndedCheckpoint(
                        event.job_id,
                        event.checkpoint_id,
                        event.kind,
                        start.timestamp_ms if start else event.timestamp_ms - event.duration_ms,
                        event.duration_ms,
                        completed=True,
                    )
                )
            case CheckpointAborted():
                start = self._triggered.pop((event.job_id, event.checkpoint_id), None)
                if start is not None:
                    self.outcomes.append(
                        EndedCheckpoint(
                            event.job_id,
                            event.checkpoint_id,
                            start.kind,
                            start.timestamp_ms,
                            event.timestamp_ms - start.timestamp_ms,
                            completed=False,
                            reason=event.reason,
                        )
                    )


FORMATS = (".png", ".svg", ".html")

_STYLES = {
    "completed": ("o", "tab:green"),
    "savepoint": ("D", "tab:blue"),
    "CHECKPOINT_EXPIRED": ("x", "tab:orange"),
    "CHECKPOINT_DECLINED": ("x", "tab:red"),
    "TASK_FAILURE": ("x", "tab:brown"),
    "CHECKPOINT_SUBSUMED": ("x", "tab:gray"),
    "CHECKPOINT_COORDINATOR_SUSPEND": ("x", "tab:purple"),
}


def write_plot(outcomes: list[EndedCheckpoint], path: Path, title: str = "checkpoints") -> None:
    """Draw durations over trigger time, one marker per outcome, one panel per job."""
    if path.suffix.lower() not in FORMATS:
        raise ValueError(f"--plot writes {', '.join(FORMATS)} files, not {path.suffix or 'no suffix'}")
    require("plot", "--plot")
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    jobs = sorted({o.job_id for o in outcomes}) or ["(no checkpoints)"]
    figure, axes = pyplot.subplots(len(jobs), 1, figsize=(11, 3.2 * len(jobs)), squeeze=False, sharex=True)
    for axis, job in zip(axes[:, 0], jobs, strict=True):
        mine = [o for o in outcomes if o.job_id == job]
        groups = {
            "completed": [o for o in mine if o.completed and o.kind is CheckpointKind.CHECKPOINT],
            "savepoint": [o for o in mine if o.completed and o.kind is CheckpointKind.SAVEPOINT],
        }
        for reason in sorted({o.reason for o in mine if not o.completed and o.reason}):
            groups[reason] = [o for o in mine if not o.completed and o.reason == reason]
        for label, points in groups.items():
            if not points:
                continue
            style = _STYLES.get(label, ("x", "black"))
            axis.scatter(
                [datetime.fromtimestamp(o.triggered_ms / 1000, UTC) for o in points],
                [max(o.duration_ms, 0.1) for o in points],
                marker=style[0],
                color=style[1],
                s=18,
                label=f"{label} ({len(points)})",
            )
        axis.set_title(f"job {job}")
        axis.set_ylabel("trigger → end (ms)")
        axis.set_yscale("log")
        axis.grid(True, alpha=0.3)
        if mine:
            axis.legend(loc="upper left", fontsize="small")
    axes[-1, 0].set_xlabel("trigger time (UTC)")
    figure.suptitle(title)
    figure.tight_layout()
    if path.suffix.lower() == ".html":
        svg = io.StringIO()
        figure.savefig(svg, format="svg")
        rows = "".join(
            f"<tr><td>{html.escape(o.job_id)}</td><td>{o.checkpoint_id}</td><td>{o.kind}</td>"
            f"<td>{'COMPLETED' if o.completed else html.escape(o.reason or 'FAILED')}</td>"
            f"<td>{o.duration_ms}</td></tr>"
            for o in outcomes[-500:]
        )
        path.write_text(
            f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:right}</style></head>"
            f"<body><h1>{html.escape(title)}</h1>{svg.getvalue()}"
            "<h2>last 500 checkpoints</h2><table><tr><th>job</th><th>id</th><th>kind</th>"
            f"<th>outcome</th><th>duration ms</th></tr>{rows}</table></body></html>"
        )
    else:
        figure.savefig(path, dpi=110)
    pyplot.close(figure)
