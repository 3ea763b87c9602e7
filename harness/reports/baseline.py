"""Baselines: one session's verdicts and key metrics, as a small JSON file worth committing.

A baseline is read from the journal (it works offline, on a GPU runner without a tracking
server) and named after the environment it describes, e.g.
`reports/baselines/NVIDIA-H200_torch-2.11.0_cuda-13.0.json`.

Each verdict in it is what counts (harness.catalogue.verdicts): a test that failed holds
`failed (was: partly)`, never `partly`, and `stands` says whether the verdict is one a later run
may be held to. A session is complete when it ended, ran the whole scenario suite (nothing
deselected, no module left out) and no test failed; anything else is saved only when asked
(`--partial`), and the file says what it lacks.

A session marked experimental (pytest's --amp-experimental, `amp-harness sessions mark`) is no
part of the team's record: `baseline save` refuses it, naming it and how to unmark it, and `last`
(`compare last`, the report's comparison) is the last session of record, the experimental ones
after it passed over and said (`passed_over`).

The file's one owner: this module writes it (`summarize` makes its fields, `save` the file,
`filename` its name) and reads it back (`read_baseline`); both hold it to the one schema of
harness.reports.baseline_format (each field typed, the verdict words closed): a bad file is a
usage error naming the file, the field and the fix, before anything is compared or recorded;
`MissingBaseline` where there is none; `auto_path` an environment's own, `parse_filename` what
a file's name says). `load` is the run a command line names, a file or a session summarized.
Comparing two of them is harness.reports.compare's job; choosing one to gate against,
harness.reports.nearest's.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from harness.catalogue import verdicts
from harness.common.errors import HarnessError
from harness.records import environments, journal_index, shapes
from harness.records.journal import Journal, Session
from harness.records.journal_index import Indexed, short_id
from harness.records.record import DEPENDS_ON_HARDWARE, SCENARIO_DIGEST
from harness.reports import baseline_format

LISTED_IN_ERRORS = 5  # sessions named by the error for an id that names none
FORMAT = baseline_format.FORMAT
# The names `filename` gives: `<class>_torch-<version>[_cuda-<version>].json`.
_NAME = re.compile(r"(?P<cls>[^_]+)_torch-(?P<torch>[^_]+?)(?:_cuda-(?P<cuda>[^_]+))?\.json")


class MissingBaseline(HarnessError):
    """No baseline file where one was looked for: reported to the user, never a failure."""

    def __init__(self, path: Path):
        self.path = path
        super().__init__(
            f"no baseline at {path}: nothing compared. After a session you trust, "
            f"`amp-harness baseline save --baselines {path.parent}` writes one there, named "
            "after its environment (`--session ID` picks another session than the last)."
        )


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


def experimental_text(session: dict) -> str:
    """`experimental: REASON` of a session entry marked so (experimental_words)."""
    return experimental_words((journal_index.mark_of(session) or {}).get("reason", ""))


def experimental_words(reason: str) -> str:
    """`experimental: REASON`, or `experimental, no reason given`, for a session marked so."""
    return f"experimental: {reason}" if reason else "experimental, no reason given"


def nothing_recorded(where: Path) -> HarnessError:
    """No session in the journal `where`, in words that name only what is there: no journal at
    all (is --reports the folder the sessions record in?), or one no session has written to."""
    if not where.is_file():
        return HarnessError(
            f"{where}: no journal was written here: no session has recorded in {where.parent} "
            "(a session records once a scenario test runs; --reports names the folder it used)"
        )
    return HarnessError(f"{where}: no session recorded in this journal yet")


def last_of_record(sessions: dict[str, Indexed], where: Path) -> tuple[str, list[str]]:
    """The id of the journal's last session not marked experimental, and the ids of the
    experimental sessions after it (oldest first), which `last` passes over."""
    if not sessions:
        raise nothing_recorded(where)
    passed: list[str] = []
    for sid in reversed(sessions):
        if not journal_index.is_experimental(sessions[sid].entry):
            return sid, passed[::-1]
        passed.append(sid)
    raise HarnessError(
        f"{where}: every session is marked experimental, {len(passed)} of them (the last: "
        f"{_named(passed[0], sessions[passed[0]].entry)}): none is of the team's record. Mark "
        "one of record with `amp-harness sessions mark ID record`, or name a session by its id"
    )


def passed_over(journal: Journal) -> str:
    """What `last` passed over, in words: the experimental sessions after the journal's last
    session of record; "" where there are none (or no session of record at all: `last` says)."""
    sessions = journal.index()
    try:
        sid, passed = last_of_record(sessions, journal.path)
    except HarnessError:
        return ""
    if not passed:
        return ""
    skipped = [f"{_named(p, sessions[p].entry)}, {experimental_text(sessions[p].entry)}"
               for p in passed]  # fmt: skip
    return (
        f"`last` is session {_named(sid, sessions[sid].entry)}, the last of record: passed over "
        f"{len(passed)} later session(s) marked experimental: {'; '.join(skipped)}"
    )


def _named(sid: str, session: dict) -> str:
    return f"{short_id(sid)} ({session['name']})"


def summarize(
    journal: Journal,
    session_id: str | None = None,
    ending: dict | None = None,
    saving: bool = False,
) -> dict:
    """The verdicts and scalar metrics of one session: by default the last of record, not
    marked experimental (`last_of_record`). `ending`: the end entry of a session still finishing
    (the plugin compares before it records its end). `saving` (`baseline save`): by default the
    last session, whatever its mark, and an experimental one is refused, naming it and how to
    unmark it."""
    sessions = journal.index()  # only the session summarized is read whole
    if not sessions:
        raise nothing_recorded(journal.path)
    if session_id is None:
        session_id = list(sessions)[-1] if saving else last_of_record(sessions, journal.path)[0]
    session_id = find_session(sessions, session_id, journal.path)
    if saving and journal_index.is_experimental(sessions[session_id].entry):
        raise _experimental_refused(sessions, session_id, journal.path)
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


def _experimental_refused(sessions: dict[str, Indexed], sid: str, where: Path) -> HarnessError:
    entry, short = sessions[sid].entry, short_id(sid)
    try:
        record = last_of_record(sessions, where)[0]
        other = (f"; the last session of record is {_named(record, sessions[record].entry)}: "
                 f"`amp-harness baseline save --session {short_id(record)}`")  # fmt: skip
    except HarnessError:
        other = ""
    return HarnessError(
        f"{where}: session {_named(sid, entry)} is marked {experimental_text(entry)}. Not saved "
        "as a baseline: an experiment is no part of the team's record. If it is one after all, "
        f"unmark it with `amp-harness sessions mark {short} record`, then save it again{other}"
    )


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


def parse_filename(name: str) -> tuple[str, str, str] | None:
    """(hardware class, torch, CUDA: "" for a CPU baseline) of a file `filename` named; None for
    a file named otherwise, not a baseline."""
    match = _NAME.fullmatch(name)
    return (match["cls"], match["torch"], match["cuda"] or "") if match else None


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
    problem = baseline_format.problem(summary)
    if problem:  # what would not read back: the harness's own mistake, said before writing
        raise HarnessError(f"{what}: its summary is no valid baseline ({problem}); nothing written")
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


# --- reading a baseline file ------------------------------------------------------------------


def auto_path(folder: Path, fingerprint: dict[str, str]) -> Path:
    """The baseline for an environment: the file `amp-harness baseline save` writes for it."""
    return Path(folder) / filename(fingerprint)


def read_baseline(path: Path) -> dict:
    """A baseline file, checked: a bad one is an error naming the file, the field and the fix."""
    if path.exists() and not path.is_file():  # a folder, /dev/zero, a pipe: never a baseline
        raise HarnessError(
            f"{path}: not a baseline file (a folder or a device): give the *.json file "
            "`amp-harness baseline save` writes"
        )
    if not path.is_file():
        raise MissingBaseline(path)
    fix = "`amp-harness baseline save` writes a valid one"
    try:
        summary = shapes.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise HarnessError(f"{path}: cannot read the baseline: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise HarnessError(f"{path}: not JSON ({exc}); {fix}") from exc
    except shapes.TooDeep:
        raise HarnessError(
            f"{path}: nested too deeply to be a baseline (a baseline is 4 levels deep); {fix}"
        ) from None
    problem = baseline_format.problem(summary)
    if problem:
        raise HarnessError(f"{path}: {problem}; {fix}")
    return summary


# --- a run named on the command line ----------------------------------------------------------


def load(spec: str, journal: Journal) -> tuple[str, dict]:
    """(label, summary) of a run named on the command line: a baseline JSON file, a session id
    recorded in the journal, or `last` for its last session."""
    if spec == "last":
        summary = summarize(journal)
    elif spec.endswith(".json") or "/" in spec or Path(spec).exists():
        return spec, read_baseline(Path(spec))
    else:
        try:
            summary = summarize(journal, spec)
        except HarnessError as exc:
            raise HarnessError(f"{exc} (or give a baseline file, *.json, or `last`)") from None
    return f"session {short_id(summary['session_id'])} ({summary['name']})", summary
