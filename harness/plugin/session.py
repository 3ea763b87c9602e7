"""The session object: what one pytest session of the plugin holds (the device, the folders, the
journal and MLflow, the records), kept in config.stash, and how it opens, records and ends."""

from __future__ import annotations

import platform
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.catalogue import claims
from harness.common import shown
from harness.common.errors import HarnessError
from harness.lab import devices
from harness.plugin.gate import Gate
from harness.records import environments, fingerprint, journal_index, stopsignals
from harness.records.journal import JOURNAL_NAME, Journal
from harness.records.journal_index import EXPERIMENTAL, MARK
from harness.records.record import Record
from harness.records.tracking import Running, Writer, redact, resolve_uri
from harness.reports import baseline

# The selection `amp-harness run` makes unless --all, -k or -m: every scenario test but the slow.
QUICK_TIER = "not slow"

STATE = pytest.StashKey["AmpSession"]()


@dataclass
class AmpSession:
    """Per-session state, kept in config.stash (never module globals: pytester nests sessions)."""

    config: pytest.Config
    device: devices.DeviceInfo
    reports: Path
    scenarios: Path
    records: list[Record] = field(default_factory=list)
    journal: Journal | None = None
    sink: Writer | None = None  # MLflow, in a process of its own: off the tests' path
    running: Running | None = None  # held while it runs: `amp-harness sync` leaves it alone
    entry: dict | None = None  # the journal's session entry, once tracking is open
    saved_threads: int | None = None
    gate: Gate | None = None  # the baseline it is compared with (--amp-baseline), if any
    current: Record | None = None  # the test running now: recorded as interrupted on Ctrl-C
    worker_reports: list[dict] = field(default_factory=list)  # in a worker: for the parent
    shared: bool = False  # a pytest-xdist worker recording into its controller's session
    journal_warnings: list[str] = field(default_factory=list)  # entries the readers skipped
    journal_down: str = ""  # why the journal could not be appended to: the session stopped
    workers_rewrote: list[str] = field(default_factory=list)  # a vanished journal re-created
    selected: set[str] = field(default_factory=set)  # scenario tests this session set out to run
    end: dict | None = None  # the journal's session_end entry, once the session ended
    deselected: int = 0  # scenario tests deselected (-k, -m, --deselect, --lf, ...)
    slow_deselected: dict[str, list[str]] = field(default_factory=dict)  # test -> its claims

    def is_scenario(self, path: Path) -> bool:
        return Path(path).resolve().is_relative_to(self.scenarios)

    def artifact_dir(self, nodeid: str) -> Path:
        return self.reports / "records" / nodeid.replace("/", "_").replace("::", ".")

    def open_tracking(self) -> None:
        """Called once scenario tests are collected; plain `pytest tests/` never tracks."""
        self.journal = Journal(self.reports / JOURNAL_NAME)
        self.journal.check_writable()
        xdist = getattr(self.config, "workerinput", {})
        self.config.add_cleanup(self.journal.close)
        if "amp_session" in xdist:  # a pytest-xdist worker: its controller opened the session
            self.entry, self.shared = xdist["amp_session"], True
            self.journal.keep(self.entry)
            if not self.config.getoption("no_mlflow"):
                uri = resolve_uri(self.config.getoption("tracking_uri"), self.reports)
                self.sink = Writer(uri, self.config.getoption("amp_experiment"), self.reports,
                                   parent_run=xdist.get("amp_parent_run"))  # fmt: skip
                self.config.add_cleanup(self.sink.close)
                self.sink.start_session(self.entry)
            return
        facts = fingerprint.collect(
            self.device, self.config.rootpath, (self.scenarios, claims.project_path())
        )
        # A bad baseline stops the session before anything is recorded.
        self.gate = Gate.open(self.config, facts)
        uri = None
        if not self.config.getoption("no_mlflow"):  # a bad URI, too
            uri = resolve_uri(self.config.getoption("tracking_uri"), self.reports)
        started = time.time()
        self.entry = {
            "type": "session",
            "session_id": uuid.uuid4().hex,
            "name": f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(started))} "
            f"{environments.label(facts)}",
            "started": started,
            "host": platform.node(),
            "args": [redact(str(a)) for a in self.config.invocation_params.args],
            "fingerprint": facts,
            **_experimental(self.config, started),
        }
        self.entry = shown.storable(self.entry)  # a Latin-1 path in the args: escaped
        # Before the session is in the journal: a sync that sees it also sees that it runs.
        self.running = Running(self.journal.path.parent, self.entry["session_id"])
        self.config.add_cleanup(self.running.close)  # also when the session stops on an error
        self.journal.keep(self.entry)
        self.journal.append(self.entry)
        if uri:  # `import mlflow` and the store's opening: in the writer's process
            self.sink = Writer(uri, self.config.getoption("amp_experiment"), self.reports)
            self.config.add_cleanup(self.sink.close)  # a session that never reached its end
            self.sink.start_session(self.entry)

    def left_out(self, recorded: set[str]) -> list[str]:
        """What of the scenario suite this session did not run, in words; [] for all of it.
        `recorded`: the tests it recorded."""
        found = []
        keyword, markexpr = (self.config.getoption(o, "") for o in ("keyword", "markexpr"))
        chosen = [f"{f} {value!r}" for f, value in (("-k", keyword), ("-m", markexpr)) if value]
        slow = self.slow_deselected if "slow" in markexpr else {}
        # `amp-harness run`'s own selection says nothing but the slow tests it left out, if any
        if chosen and not (markexpr == QUICK_TIER and not keyword):
            found.append(f"tests selected with {' '.join(chosen)}")
        elif self.deselected and not chosen:
            found.append(f"{self.deselected} scenario test(s) deselected")
        if slow:
            found.append(self._slow_left_out())
        named = [a for a in self.config.args if "::" in a]
        if named:
            found.append(f"tests named one by one: {', '.join(named)}")
        root = self.config.rootpath
        ran_modules = {(root / nodeid.split("::")[0]).resolve() for nodeid in self.selected}
        said = {(root / nodeid.split("::")[0]).resolve() for nodeid in slow}  # all slow, named
        modules = sorted(
            p.name for p in self.scenarios.glob("test_*.py") if p not in ran_modules | said
        )
        if modules:
            found.append(f"scenario modules not run: {', '.join(modules)}")
        never = sorted(self.selected - recorded)
        if never:
            found.append(f"{len(never)} selected test(s) never ran (-x, or a crash?)")
        return found

    def _slow_left_out(self) -> str:
        claim_ids = dict.fromkeys(c for ids in self.slow_deselected.values() for c in ids)
        return (
            f"{len(self.slow_deselected)} slow test(s) left out, of {', '.join(claim_ids)} "
            "(`amp-harness run --all` runs them)"
        )

    def compare_with_baseline(self, ending: dict) -> None:
        """Compare with the baseline before the session's end is recorded (a regression may
        fail the session): `ending` is the end entry to be."""
        if self.gate is not None and self.gate.summary is not None:
            sid = self.entry["session_id"]
            self.gate.compare(
                self.read_journal(lambda: baseline.summarize(self.journal, sid, ending))
            )

    def session_records(self) -> list[Record]:
        """This session's records; a pytest-xdist controller reads its workers' (and those of
        tests whose worker died, which it recorded itself) from the journal."""
        if self.journal is None or not xdist_controller(self.config):
            return self.records
        sid = self.entry["session_id"]
        session = self.read_journal(self.journal.index)[sid]
        return self.journal.load([session])[sid].records

    def read_journal(self, read):
        """`read()` of the journal, its warnings (entries it skipped, naming file:line) kept to
        be shown under the verdict table: inside a session warnings may be errors, and a damaged
        line must not cost the session its table and its end."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = read()
        self.journal_warnings += [str(w.message) for w in caught]
        return result

    @property
    def worker_output(self) -> str | None:
        return self.config.getoption("amp_worker_output")

    def finish(self, record: Record) -> None:
        self.current = None
        # Text that is not clean UTF-8 (a file name in evidence, a skip reason) is escaped before
        # the record reaches anything: the journal, MLflow, the worker's file, the table.
        record.make_storable()
        record.message = redact(record.message)  # a failure may quote a URI with its password
        self.records.append(record)
        if self.journal is None:
            return
        entry = {
            "type": "record",
            "session_id": self.entry["session_id"],
            "record": record.to_dict(),
        }
        try:
            self.append(entry)
        except HarnessError as exc:  # a full disk: nothing more can be recorded, say so and stop
            self.journal_down = str(exc)
            pytest.exit(f"amp-harness: {exc}", returncode=pytest.ExitCode.INTERNAL_ERROR)
        if self.sink:
            self.sink.log_record(self.entry, record)

    def crashed(self, record: Record, message: str) -> None:
        """A test whose process died: what it had measured is lost with it, its failure is not."""
        record.outcome, record.message = "failed", message
        record.ended = time.time()
        self.finish(record)

    def interrupted(self, exitstatus: int | pytest.ExitCode) -> None:
        """Ctrl-C (or a fatal error) stopped the test running now midway, if one was."""
        if self.current is None:
            return
        record, self.current = self.current, None
        record.outcome, record.message = "interrupted", f"session ended: {exitstatus!r}"
        if stopsignals.received:  # SIGTERM, SIGHUP: taken as Ctrl-C
            record.message += f" (stopped by {stopsignals.received})"
        record.ended = time.time()
        self.finish(record)

    def record_end(self, session: pytest.Session) -> None:
        """The session's end in the journal and in MLflow, with what it left out of the suite and
        its counts; a regression against the baseline fails it (--amp-fail-on-regression)."""
        records = self.session_records()  # a pytest-xdist controller reads them from the journal
        end = {"type": "session_end", "session_id": self.entry["session_id"]}
        end["left_out"] = self.left_out({r.test for r in records})
        counts: dict[str, int] = {}
        for r in records:
            counts[r.outcome] = counts.get(r.outcome, 0) + 1
        # Before the session's end is recorded: a regression that fails the session is its status.
        try:
            self.compare_with_baseline(end)
        except BaseException:  # a comparison that breaks costs the journal nothing: the end first
            self._keep_end(end, session, counts)
            raise
        if (
            self.gate is not None
            and self.gate.fails()
            and session.exitstatus == pytest.ExitCode.OK  # a worse status (interrupted, ...) stays
        ):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        self._keep_end(end, session, counts)

    def _keep_end(self, end: dict, session: pytest.Session, counts: dict[str, int]) -> None:
        end.update(ended=time.time(), exitstatus=int(session.exitstatus), counts=counts)
        self.end = end  # for the session's last lines (harness.plugin.summary)
        try:
            if not self.journal_down:
                self.append(end)
            if self.sink:
                self.sink.end_session(self.entry, end)
        except HarnessError as exc:  # the journal could not take the end: said under the table
            self.journal_down = str(exc)
        finally:
            if self.running:  # from here on, `amp-harness sync` may end its run if need be
                self.running.close()

    def append(self, entry: dict) -> None:
        """Append `entry` to the journal, which re-creates itself if it vanished (Journal.keep).
        The lock that tells `amp-harness sync` this session runs went with its folder: it is
        taken again first, so that no sync ends the session's run while it still records."""
        if self.running is not None and self.journal.vanished():
            self.running.close()
            self.running = Running(self.journal.path.parent, self.entry["session_id"])
            self.config.add_cleanup(self.running.close)
        self.journal.append(entry)

    def rewrote(self) -> list[str]:
        """Each time this session's processes re-created a journal that vanished, in words."""
        return (self.journal.rewritten if self.journal else []) + self.workers_rewrote


def _experimental(config: pytest.Config, started: float) -> dict:
    """The session entry's mark (journal_index.MARK) where --amp-experimental, or its reason,
    asks for one; its runs in MLflow are tagged from it."""
    reason = config.getoption("amp_experimental_reason")
    if not config.getoption("amp_experimental") and reason is None:
        return {}
    return {MARK: journal_index.mark(EXPERIMENTAL, reason or "", started)}


def state_of(config: pytest.Config) -> AmpSession:
    return config.stash[STATE]


def session_id(config: pytest.Config) -> str | None:
    """The id of the session `config` recorded (`amp-harness run` prints it last); None where it
    recorded none (nothing collected, a usage error)."""
    state = config.stash.get(STATE, None)
    return state.entry["session_id"] if state and state.entry and not state.shared else None


def xdist_controller(config: pytest.Config) -> bool:
    return config.pluginmanager.hasplugin("dsession")
