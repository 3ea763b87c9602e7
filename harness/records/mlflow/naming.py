"""What a run in MLflow is called and holds: a test run's name and description, the tags a run is
given (cut and without passwords, `_clean`; a session's environment and its mark), the status
a test's outcome or a session's exit status makes, and the points of a long history MLflow
gets (`downsampled`)."""

from __future__ import annotations

from harness.catalogue import verdicts
from harness.records import journal_index
from harness.records.mlflow.uris import redact
from harness.records.record import Record

COMPLETE = "amp.complete"  # "false" from the run's creation, "true" as its last call
END_REASON = "amp.end_reason"  # on a session run ended by `sync`, not by its session
LEFT_OUT = "amp.left_out"  # on a session run: what of the suite it did not run, if anything
EXIT_STATUS = "amp.exitstatus"  # on a session run: pytest's exit status
# On a session's parent and test runs once it is marked (journal_index.MARK: pytest's
# --amp-experimental, `amp-harness sessions mark`): "true" for an experiment, "false" once of
# record again; a team filters experiments out with `tags.amp.experimental != 'true'`.
EXPERIMENTAL = "amp.experimental"
EXPERIMENTAL_REASON = "amp.experimental_reason"
DOWNSAMPLED = "amp.downsampled"  # on a test run: its histories MLflow got fewer points of
# The points of one history MLflow gets: each is a row of its store (a 10^6-step history took
# 365 s and 1.46 GB to log, 249 MB to keep; now 2.2 s, most of it record.json, which holds it
# whole, and 2.4 MB). 2,000 points log in 0.1 to 0.3 s and give each of 1,000 stretches its
# highest and lowest value (downsampled): a chart 1,000 pixels wide, three times the 320
# points MLflow's UI samples of a history to draw it.
HISTORY_POINTS = 2000

_STATUS = {
    "passed": "FINISHED",
    "skipped": "FINISHED",
    "failed": "FAILED",
    "error": "FAILED",
    "interrupted": "KILLED",  # Ctrl-C
    verdicts.CAPABILITY_REGRESSION: "FAILED",
}
_TAG_LIMIT = 5000  # MLflow accepts 8000 characters; evidence longer than this is cut
RUN_NAME_CHARS = 250  # MLflow's limit on a run name


def downsampled(values: list[float], limit: int = HISTORY_POINTS) -> list[tuple[int, float]]:
    """(step, value) for the points of a history MLflow gets: all of them up to `limit`; of a
    longer one, the first and the last step and, in each of (limit - 2) // 2 equal stretches of
    the steps between, the lowest and the highest value (a NaN counts as both: a step that went
    NaN is what a history of mixed precision is read for), in step order, at their real steps."""
    if len(values) <= limit:
        return list(enumerate(values))
    import numpy as np

    series = np.asarray(values, dtype=np.float64)
    nan = np.isnan(series)
    low, high = np.where(nan, -np.inf, series), np.where(nan, np.inf, series)
    edges = np.linspace(1, len(series) - 1, (limit - 2) // 2 + 1).astype(np.int64).tolist()
    steps = {0, len(series) - 1}
    for start, end in zip(edges[:-1], edges[1:], strict=True):
        steps.update((start + int(low[start:end].argmin()), start + int(high[start:end].argmax())))
    return [(step, values[step]) for step in sorted(steps)]


def run_name(record: Record, found: dict[str, verdicts.Status]) -> str:
    """What the runs list shows: the claims and their verdicts as they count (`found`:
    verdicts.of_record), then the test ("SCL-NAN-INCREASES refuted · test_nan_halves_the_scale")."""
    verdicts_shown = ", ".join(f"{claim} {status.label}" for claim, status in found.items())
    name = f"{verdicts_shown} · {record.test.split('::')[-1]}"
    return name if len(name) <= RUN_NAME_CHARS else name[: RUN_NAME_CHARS - 1] + "\u2026"


def description(record: Record, found: dict[str, verdicts.Status]) -> str:
    """The run's description in the MLflow UI (Markdown): each claim's verdict and evidence."""
    lines = [f"`{record.test}`: {record.outcome or '?'}", ""]
    for claim, status in found.items():
        lines += [f"**{claim}**: {status.label}", "", status.evidence, ""]
    return "\n".join(lines)  # cut to MLflow's limit, as every tag, by _clean


def _clean(tags: dict[str, str]) -> dict[str, str]:
    """Tags as MLflow gets them: without passwords, and cut to a length it takes."""
    return {k: redact(v)[:_TAG_LIMIT] for k, v in tags.items()}


def _session_status(exitstatus: int) -> str:
    """pytest's exit status as an MLflow run status: 2 is an interrupted session (Ctrl-C)."""
    return {0: "FINISHED", 2: "KILLED"}.get(exitstatus, "FAILED")


def _env_tags(session: dict) -> dict[str, str]:
    return {f"env.{k}": v for k, v in session["fingerprint"].items()}


def mark_tags(session: dict) -> dict[str, str]:
    """The tags of a session entry's mark (journal_index.MARK) on its runs: EXPERIMENTAL and
    its reason ("" where none was given); none where it was never marked."""
    found = journal_index.mark_of(session)
    if found is None:
        return {}
    experimental = found["state"] == journal_index.EXPERIMENTAL
    return {EXPERIMENTAL: str(experimental).lower(), EXPERIMENTAL_REASON: found["reason"]}
