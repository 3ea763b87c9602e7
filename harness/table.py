"""The verdict table printed at the end of a session: claim, verdict, evidence, device."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from harness.claims import catalogue
from harness.record import Record

VERDICT_STYLE = {
    "confirmed": "green",
    "refuted": "red",
    "partly": "yellow",
    "inconclusive": "magenta",
    "skipped": "dim",
}


def verdict_rows(records: list[Record]) -> list[tuple[str, str, str, str, str]]:
    """(claim, verdict, evidence, device, test) in catalogue order; a claim whose test failed
    before deciding shows the failure instead of a verdict."""
    order = {claim_id: i for i, claim_id in enumerate(catalogue())}
    rows = []
    for record in records:
        for claim in record.claims:
            verdict = record.verdicts.get(claim)
            if verdict:
                rows.append((claim, verdict.verdict, verdict.evidence, record.device, record.test))
            else:
                note = f"no verdict: test {record.outcome}: {record.message}".strip(": ")
                rows.append((claim, "-", note, record.device, record.test))
    return sorted(rows, key=lambda row: (order.get(row[0], len(order)), row[4]))


def render(records: list[Record], width: int, color: bool) -> str:
    devices = sorted({record.device for record in records})
    table = Table(title=f"amp-harness verdicts on {'; '.join(devices)}", expand=True)
    table.add_column("claim", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("evidence", ratio=1, overflow="fold")  # the evidence gets the room
    table.add_column("device", max_width=16, overflow="fold")
    for claim, verdict, evidence, device, _test in verdict_rows(records):
        table.add_row(
            claim, verdict, evidence, device, style=VERDICT_STYLE.get(verdict, "bold red")
        )
    out = io.StringIO()
    Console(file=out, width=width, force_terminal=color, no_color=not color).print(table)
    return out.getvalue()
