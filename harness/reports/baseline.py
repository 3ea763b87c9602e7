"""Baselines: one session's verdicts and key metrics, as a small JSON file worth committing.

A baseline is read from the journal (it works offline, on a GPU runner without a tracking
server) and named after the environment it describes, e.g.
`reports/baselines/NVIDIA-H200_torch-2.11.0_cuda-13.0.json`.

Each verdict in it is what counts (harness.catalogue.verdicts): a test that failed holds
`failed (was: partly)`, never `partly`, and `stands` says whether the verdict is one a later run
may be held to. A session is complete when it ended, ran the whole scenario suite (nothing
deselected, no module left out) and no test failed; anything else is saved only when asked
(`--partial`), and the file says what it lacks.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from harness.catalogue import verdicts
from harness.common.errors import HarnessError
from harness.records import environments, shapes
from harness.records.journal import Journal, Session
from harness.records.journal_index import Indexed, short_id
from harness.records.record import DEPENDS_ON_HARDWARE, SCENARIO_DIGEST

LISTED_IN_ERRORS = 5  # sessions named by the error for an id that names none
FORMAT = 2  # 2: verdicts carry their test's outcome (`stands`); sessions say what they lack


def find_session(sessions: dict[str, Indexed], session_id: str, where: Path) -> str:
    """The full id of the session `session_id` names: the id itself or a unique prefix of it
    (the 12 characters `sessions` and every session's end print)."""
    if session_id in sessions:
        return session_id
    matches = [sid for sid in sessions if sid.startswith(session_id)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise HarnessError(
            f"{where}: session {session_id!r} is ambiguous: it starts "
            f"{', '.join(m[:12] for m in matches)}; give more of the id"
        )
    # The latest few, as `amp-harness sessions` names them: a year of CI history is 50,000
    # sessions, and an error that lists them all is a page nobody reads.
    latest = list(sessions.items())[-LISTED_IN_ERRORS:]
    shown = ", ".join(f"{short_id(sid)} ({s.entry['name']})" for sid, s in reversed(latest))
    more = len(sessions) - len(latest)
    recorded = f"the latest: {shown}" + (f", and {more} older" if more else "")
    raise HarnessError(
        f"{where}: no session {session_id!r}; {recorded} (`amp-harness sessions` lists them all)"
    )


def summarize(journal: Journal, session_id: str | None = None, ending: dict | None = None) -> dict:
    """The verdicts and scalar metrics of one session (the last one by default). `ending`: the
    end entry of a session still finishing (the plugin compares before it records its end)."""
    sessions = journal.index()  # only the session summarized is read whole
    if not sessions:
        raise HarnessError(f"{journal.path}: no session recorded yet: run `amp-harness run` first")
    if session_id is None:
        session_id = list(sessions)[-1]
    session_id = find_session(sessions, session_id, journal.path)
    session = journal.load([sessions[session_id]])[session_id]
    if ending is not None:
        session.end = ending
    statuses = [(r, verdicts.of_record(r)) for r in session.records]
    lacking = lacks(session)
    return {
        "format": FORMAT,
        "session_id": session_id,
        "name": session.entry["name"],
        "started": session.entry["started"],
        "complete": not lacking,
        "lacks": lacking,
        "fingerprint": session.entry["fingerprint"],
        "verdicts": [
            {
                "claim": claim,
                "verdict": status.label,
                "stands": status.stands,
                "evidence": status.evidence,
                "test": record.test,
            }
            for record, by_claim in statuses
            for claim, status in by_claim.items()
        ],
        "tests": {
            r.test: {
                "outcome": r.outcome,
                "claims": r.claims,
                "metrics": r.to_dict()["metrics"],  # inf/NaN as text
                "key_metrics": list(r.key_metrics()),  # Record.key_metric: compared to 4 digits
                # Record.depends_on_hardware: what a difference across hardware classes may
                # be attributed to
                "depends_on_hardware": sorted(
                    environments.depends_on(r.params.get(DEPENDS_ON_HARDWARE))
                ),
                # The digest of its scenario file: `compare` says where two runs ran other code
                SCENARIO_DIGEST: r.params.get(SCENARIO_DIGEST, ""),
            }
            for r in session.records
        },
    }


def lacks(session: Session) -> list[str]:
    """What keeps a session from being a complete run of the suite, in words; [] if nothing."""
    if session.end is None:
        return ["the session did not end (killed, or still running): its last tests are missing"]
    found = list(session.end.get("left_out", []))
    not_passed: dict[str, list[str]] = {}
    for record in session.records:
        if record.outcome not in ("passed", "skipped"):
            not_passed.setdefault(record.outcome, []).append(record.test.split("::")[-1])
    found += [f"{len(tests)} test(s) {outcome}: {', '.join(tests)}" for outcome, tests in
              not_passed.items()]  # fmt: skip
    return found


def filename(fingerprint: dict[str, str]) -> str:
    """Hardware class, torch and CUDA versions: what a baseline's numbers depend on most
    (`cpu-x86-64-avx2_torch-2.13.0+cpu.json`, `NVIDIA-H200_torch-2.11.0_cuda-13.0.json`). A
    fact the fingerprint lacks (from another version) reads n/a."""
    fact = functools.partial(environments.fact, fingerprint)
    parts = [environments.hardware_class(fingerprint), f"torch-{fact('torch')}"]
    if fact("device") == "cuda":
        parts.append(f"cuda-{fact('cuda')}")
    return "_".join(re.sub(r"[^A-Za-z0-9.+-]+", "-", p).strip("-") for p in parts) + ".json"


def legacy_filename(fingerprint: dict[str, str]) -> str:
    """The name a harness before hardware classes gave this environment's baseline
    (`cpu-x86-64_torch-2.13.0+cpu.json`): never picked as this environment's, since it does not
    say which CPU class it was measured on, but worth naming where one lies."""
    legacy = {k: v for k, v in fingerprint.items() if k != "hardware_class"}
    return filename(legacy)


def save(summary: dict, folder: Path, partial: bool = False, force: bool = False) -> Path:
    """Write the baseline file for the summary's environment. Refused: a session without
    verdicts; an incomplete one unless `partial`; replacing a file unless `force`."""
    what = f"session {summary['name']!r} ({summary['session_id'][:8]})"
    if not summary["verdicts"]:  # a session that stopped early: later runs would all "regress"
        raise HarnessError(
            f"{what} recorded no verdict in {len(summary['tests'])} tests: not saved as a "
            "baseline; its pytest output says why"
        )
    if summary["lacks"] and not partial:
        raise HarnessError(
            f"{what} is not a complete run of the suite: {'; '.join(summary['lacks'])}. Not "
            "saved: run the whole suite (`amp-harness run --all`) and save that, or pass --partial "
            "to save this one marked incomplete"
        )
    path = Path(folder) / filename(summary["fingerprint"])
    if path.exists() and not force:
        raise HarnessError(f"{path} exists ({_describe(path)}): pass --force to replace it")
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps(summary, ensure_ascii=False, indent=1, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")
    return path


def _describe(path: Path) -> str:
    try:
        old = shapes.loads(path.read_text(encoding="utf-8"))
        return (
            f"session {old['name']!r}, {len(old['verdicts'])} verdicts, "
            f"{'complete' if old.get('complete') else 'incomplete'}"
        )
    except (OSError, ValueError, KeyError, TypeError):
        return "not a readable baseline"
