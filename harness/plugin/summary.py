"""What the session says at its end, on the terminal: the verdict table, where its journal and its
MLflow runs are, what went wrong in recording, the comparison with a baseline (harness.plugin.gate),
and its last lines, after pytest's own summary."""

from __future__ import annotations

import pytest

from harness.common import shown
from harness.plugin.session import AmpSession, state_of
from harness.records import warned
from harness.records.journal_index import short_id
from harness.records.tracking import command_line
from harness.reports.table import cap, counts_line, for_terminal, indented


def write(terminalreporter, config: pytest.Config) -> None:
    state = state_of(config)
    if state.entry is None:
        return
    writer = terminalreporter._tw
    records = state.session_records()
    if records:
        # The terminal's own encoding: pytest escapes a whole text it cannot encode (the table
        # on one line, with literal \n), so the table is made for it.
        encoding = getattr(getattr(writer, "_file", None), "encoding", None)
        terminalreporter.write(for_terminal(
            records, writer.fullwidth, writer.hasmarkup, encoding,
            verbose=config.getoption("verbose") > 0, tty=bool(terminalreporter.isatty()),
        ))  # fmt: skip

    say = terminalreporter.write_line  # one line each: scripts grep `MLflow: ...` whole
    say(f"journal: {state.journal.path}")
    for record in records:
        if warned.FIELD in record.params:
            say(
                f"torch warned in {record.test} (recorded with it, not fatal): "
                + shown.visible(cap(record.params[warned.FIELD], "in its record", 300, 1)),
                yellow=True,
            )
    for message in dict.fromkeys(state.journal_warnings):
        say(f"journal: {message}", yellow=True)
    for message in state.rewrote():
        say(f"journal: {message}", red=True, bold=True)
    if state.journal_down:
        say(f"journal: {state.journal_down}", red=True, bold=True)
    if state.sink is None:
        sync = command_line("sync", reports=state.reports)
        say(f"MLflow: off (--no-mlflow); {sync} sends the journal later")
    elif state.sink.down:
        say(
            f"MLflow: {state.sink.down}; every result is in the journal: {state.sink.recovery()}",
            yellow=True,
        )
    else:
        say(
            f"MLflow: {state.sink.label} (experiment {state.sink.experiment!r}); "
            f"{state.sink.browse()}"
        )
    for refused in state.sink.refused if state.sink else []:
        say(f"MLflow refused {refused}; the result is in the journal", yellow=True)
    for note in state.sink.notes if state.sink else []:
        say(f"MLflow: {note}")
    if state.gate is not None:
        state.gate.write(terminalreporter, state.entry, state.reports)


class LastLines:
    """The session's last lines, after pytest's short test summary (its wrapper's `finally`;
    this one is outermost): the tail of a CI log says the counts, the session's id and where
    its report is."""

    def __init__(self, config: pytest.Config):
        self.config = config

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_terminal_summary(self, terminalreporter):
        try:
            return (yield)
        finally:
            state = state_of(self.config)
            if state.entry is not None and not state.shared:
                width = terminalreporter._tw.fullwidth
                for line in _last_lines(state):
                    for wrapped in indented(shown.visible(line), width, "", whole_words=True):
                        terminalreporter.write_line(wrapped)  # paths and commands to copy


def _last_lines(state: AmpSession) -> list[str]:
    """The counts, the session's id and whether it ran the whole suite, how to find and compare
    it, and how its report is made: each command for the folder and the store the session used
    (command_line)."""
    sid = short_id(state.entry["session_id"])
    left_out = state.end["left_out"] if state.end else ["the session did not end"]
    run = f"partial ({'; '.join(left_out)})" if left_out else "the whole suite"
    folder, uri = state.reports, state.sink.uri if state.sink else None
    report = f"{command_line('report', reports=folder, uri=uri)} writes it from MLflow"
    if state.sink is None:
        report = f"{command_line('sync', reports=folder)}, then {report}"
    return [
        counts_line(state.session_records()),
        f"session {sid}: {run}",
        f"sessions: {command_line('sessions', reports=folder)}; compare: "
        f"{command_line('compare', 'ID', sid, reports=folder)}",
        f"report: {report}",
    ]
