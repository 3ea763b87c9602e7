"""Baselines: one session's verdicts and key metrics, as a small JSON file worth committing.

A baseline is read from the journal (it works offline, on a GPU runner without a tracking
server) and named after the environment it describes, e.g.
`reports/baselines/NVIDIA-H200_torch-2.11.0_cuda-13.0.json`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from harness.errors import HarnessError
from harness.journal import Journal

FORMAT = 1


def summarize(journal: Journal, session_id: str | None = None) -> dict:
    """The verdicts and scalar metrics of one session (the last one by default)."""
    sessions = journal.sessions()
    if not sessions:
        raise HarnessError(f"{journal.path}: no session recorded yet: run `amp-harness run` first")
    if session_id is None:
        session_id = list(sessions)[-1]
    elif session_id not in sessions:
        raise HarnessError(
            f"{journal.path}: no session {session_id!r}; recorded: {', '.join(sessions)}"
        )
    session = sessions[session_id]
    return {
        "format": FORMAT,
        "session_id": session_id,
        "name": session.entry["name"],
        "started": session.entry["started"],
        "complete": session.end is not None,
        "fingerprint": session.entry["fingerprint"],
        "verdicts": [
            {"claim": v.claim, "verdict": v.verdict, "evidence": v.evidence, "test": r.test}
            for r in session.records
            for v in r.verdicts.values()
        ],
        "tests": {
            r.test: {"outcome": r.outcome, "metrics": r.to_dict()["metrics"]}  # inf/NaN as text
            for r in session.records
        },
    }


def filename(fingerprint: dict[str, str]) -> str:
    """GPU (or CPU), torch and CUDA versions: what a baseline's numbers depend on most."""
    if fingerprint["device"] == "cuda":
        parts = [
            fingerprint["gpu_name"],
            f"torch-{fingerprint['torch']}",
            f"cuda-{fingerprint['cuda']}",
        ]
    else:
        parts = [f"cpu-{fingerprint['cpu']}", f"torch-{fingerprint['torch']}"]
    return "_".join(re.sub(r"[^A-Za-z0-9.+-]+", "-", p).strip("-") for p in parts) + ".json"


def save(summary: dict, folder: Path) -> Path:
    if not summary["verdicts"]:  # a session that stopped early: later runs would all "regress"
        raise HarnessError(
            f"session {summary['name']!r} ({summary['session_id']}) recorded no verdict in "
            f"{len(summary['tests'])} tests: not saved as a baseline; its pytest output says why"
        )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / filename(summary["fingerprint"])
    text = json.dumps(summary, ensure_ascii=False, indent=1, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")
    return path
