"""The collection contract: every scenario test names known claims (a module that breaks it fails
to collect), what was selected and deselected, and tracking opened once scenario tests are in."""

from __future__ import annotations

import pytest

from harness.catalogue.claims import unknown_ids
from harness.common.errors import HarnessError
from harness.plugin import process
from harness.plugin.session import state_of


def claim_ids(item: pytest.Item) -> list[str] | None:
    markers = list(item.iter_markers("claim"))
    if not markers:
        return None
    return [claim_id for marker in markers for claim_id in marker.args]


def _contract_problems(item: pytest.Item) -> list[str]:
    ids = claim_ids(item)
    if not ids:
        return [
            f"{item.nodeid}: no claim marker. Every scenario test names the claims it checks, "
            'e.g. @pytest.mark.claim("FMT-BITS"); `amp-harness list` shows the IDs.'
        ]
    return [
        f"{item.nodeid}: unknown claim ID {bad!r} in @pytest.mark.claim; closest valid IDs: "
        f"{near} (`amp-harness list` shows all)"
        for bad, near in unknown_ids(ids)
    ]


def check(collector: pytest.Collector, report: pytest.CollectReport) -> None:
    """A scenario module whose tests break the claim contract fails to collect, by name."""
    if report.passed and isinstance(collector, pytest.Module | pytest.Class):
        state = state_of(collector.config)
        if state.is_scenario(collector.path):
            problems = [
                p
                for node in report.result
                if isinstance(node, pytest.Function)
                for p in _contract_problems(node)
            ]
            if problems:
                report.outcome = "failed"
                report.longrepr = "\n".join(problems)


def deselected(items: list[pytest.Item]) -> None:
    if items:
        state = state_of(items[0].config)
        scenarios = [item for item in items if state.is_scenario(item.path)]
        state.deselected += len(scenarios)
        state.slow_deselected |= {
            item.nodeid: claim_ids(item) or []
            for item in scenarios
            if item.get_closest_marker("slow")
        }


def finished(session: pytest.Session) -> None:
    state = state_of(session.config)
    if session.config.option.collectonly:
        return  # nothing runs, nothing to record
    state.selected = {item.nodeid for item in session.items if state.is_scenario(item.path)}
    if state.selected:
        process.hold_threads(state)
        if state.worker_output:
            return  # a worker's parent records what it runs
        try:
            state.open_tracking()
        except HarnessError as exc:
            raise pytest.UsageError(str(exc)) from None
