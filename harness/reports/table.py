"""The verdicts printed at the end of a session, chosen by `for_terminal`:
- on a terminal, `summary`: the devices once, then one line per claim (its ID, its verdict across
  the session's tests by harness.catalogue.verdicts' rule, and the start of its evidence cut to
  the terminal's width); under `pytest -v` on a wide terminal, `render`: the full table, each
  test's own status and evidence;
- in a CI log or a pipe (no terminal), and under -v on a narrow terminal, `blocks`: each claim's
  ID and verdict on one line, its evidence in full on the lines under it, indented and wrapped
  at the width (a table's evidence column at 80 columns was 20 characters wide: one claim took
  30 lines, and the summary's cut evidence never showed a number).
The counts (`counts_line`) close the session, after pytest's own summary (harness.plugin).

Evidence is capped where it is shown (`cap`: EVIDENCE_CHARS characters and EVIDENCE_LINES lines
per test, then how much more there is and where): a scenario that puts 1 MB into its evidence
once printed 31,791 terminal lines. The full text stays in the journal and in record.json; the
report (harness.reports.ledger_columns) caps its entries the same way.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from harness.catalogue import verdicts
from harness.catalogue.claims import ARTICLE, VERDICTS, Claim, catalogue
from harness.common import shown
from harness.records.record import Record

VERDICT_STYLE = {
    "confirmed": "green",
    "refuted": "red",
    "partly": "yellow",
    "inconclusive": "magenta",
    "skipped": "dim",
    verdicts.CANNOT_COMPILE: "cyan",  # about the compiler, not the claim
}
KIND_STYLE = {verdicts.FAILED: "bold red", verdicts.REGRESSION: "bold red reverse"}
# Above what any scenario writes (the longest, test_convergence's seeds and intervals, is 1,784
# characters on one line: 1,500 cut its last 284 in a CI log), so real evidence is shown whole;
# past it, one claim would bury the others.
EVIDENCE_CHARS = 4000
EVIDENCE_LINES = 12
IN_THE_JOURNAL = "in the journal and record.json"
SOURCE_CHARS = 48  # a claim's source under its ID: enough to recognise it, the rest in `list`
# Under -v, a terminal narrower than this gets blocks, not the table: the table's evidence
# column is what is left of the width after the claim, verdict and device columns.
TABLE_WIDTH = 120
INDENT = "    "  # a block's evidence, under its claim
# What a count of verdicts counts, said in the same words wherever one is shown: the session's
# last lines count claims, the report's header claim-test pairs.
PER_CLAIM = "one verdict per claim, across its tests"
PER_CLAIM_AND_TEST = "one verdict per claim and test"


def cap(text: str, where: str, chars: int = EVIDENCE_CHARS, lines: int = EVIDENCE_LINES) -> str:
    """`text` cut to `chars` characters and `lines` lines, followed by how many characters were
    left out and `where` the full text is; unchanged when it fits."""
    kept = "\n".join(text[:chars].split("\n")[:lines])
    if len(kept) >= len(text.rstrip()):  # what is left out, if anything, is trailing space
        return text
    kept = kept.rstrip()
    more = len(text) - len(kept)
    return f"{kept}\u2026 ({more:,} more character{'s' if more != 1 else ''} {where})"


def verdict_rows(records: list[Record]) -> list[tuple[str, str, str, str]]:
    """(claim, verdict, evidence, device) in catalogue order. With one test the evidence is its
    own; with several, each test's line names it and its status. Each test's evidence is capped
    (`cap`)."""
    rows = []
    for claim, verdict in _in_catalogue_order(records):
        capped = tuple(
            dataclasses.replace(s, evidence=cap(s.evidence, IN_THE_JOURNAL))
            for s in verdict.statuses
        )
        evidence = dataclasses.replace(verdict, statuses=capped).evidence
        rows.append((claim, verdict.label, evidence, verdict.device))
    return rows


def _in_catalogue_order(records: list[Record]) -> list[tuple[str, verdicts.ClaimVerdict]]:
    """Each claim's verdict across the records' tests, in catalogue order (unknown IDs last)."""
    order = {claim_id: i for i, claim_id in enumerate(catalogue())}
    found = verdicts.by_claim(records).items()
    return sorted(found, key=lambda item: order.get(item[0], len(order)))


def _one_line(text: str, chars: int) -> str:
    """`text` on one line (its whitespace runs as single spaces), cut to `chars` with "…"."""
    text = " ".join(text.split())
    return text if len(text) <= chars else text[: chars - 1].rstrip() + "\u2026"


def regressions(records: list[Record]) -> list[str]:
    """One line per capability regression, apart from the skips: capability, tests, claims."""
    found: dict[str, list[Record]] = {}
    for record in records:
        if record.outcome == verdicts.CAPABILITY_REGRESSION:
            found.setdefault(record.message, []).append(record)
    return [
        f"{cap(message, IN_THE_JOURNAL)} ({len(group)} test{'s' if len(group) > 1 else ''}; claims "
        f"{', '.join(dict.fromkeys(c for r in group for c in r.claims))})"
        for message, group in found.items()
    ]


def _style(label: str) -> str:
    kind = next((k for k in KIND_STYLE if label.startswith(k)), None)
    if kind:
        return KIND_STYLE[kind]
    return VERDICT_STYLE.get(label, "yellow")  # "mixed (...)": tests disagree


def _claim_cell(claim_id: str, claim: Claim | None) -> Text:
    """The ID, and under it where a claim from beyond the article comes from (a paper, an issue,
    a team decision): the article's claims, the table's default, keep one line."""
    cell = Text(claim_id)
    if claim is not None and claim.catalogue != ARTICLE:
        cell.append(f"\n{shown.visible(_one_line(claim.source, SOURCE_CHARS))}", "dim")
    return cell


def against_expected(label: str, claim: Claim | None) -> str:
    """A decided verdict other than the one the claim's catalogue expects says so."""
    expected = claim.expected if claim is not None else None
    if expected and label in VERDICTS and label not in (expected, "skipped"):
        return f"{label} (expected {expected})"
    return label


def _console(width: int, color: bool, encoding: str | None) -> Console:
    """A console that writes text for a terminal of `width` columns in `encoding` (shown.Buffer:
    ASCII boxes and escapes where it is not UTF-8); its text is `console.file.getvalue()`."""
    out = shown.Buffer(encoding)
    return Console(file=out, width=width, force_terminal=color, no_color=not color, highlight=False)


def _title(records: list[Record]) -> Text:
    devices = sorted({record.device for record in records})
    return shown.text(f"amp-harness verdicts on {'; '.join(devices)}", style="bold")


def for_terminal(
    records: list[Record], width: int, color: bool, encoding: str | None, verbose: bool, tty: bool
) -> str:
    """The verdicts as the end of a session shows them (the module docstring): `summary` on a
    terminal, `render` under -v on one at least TABLE_WIDTH wide, else `blocks`."""
    if tty and not verbose:
        return summary(records, width, color, encoding)
    if tty and width >= TABLE_WIDTH:
        return render(records, width, color, encoding)
    return blocks(records, width, color, encoding, verbose)


def summary(records: list[Record], width: int, color: bool, encoding: str | None = None) -> str:
    """One line per claim under a title naming the devices once. Text from records is shown as
    data (harness.common.shown), in the terminal's `encoding`."""
    found = _in_catalogue_order(records)
    known = catalogue()
    console = _console(width, color, encoding)
    console.print(_title(records))
    id_width = max((len(claim) for claim, _verdict in found), default=0)
    labels = [against_expected(verdict.label, known.get(claim)) for claim, verdict in found]
    label_width = min(max((len(label) for label in labels), default=0), 28)
    for (claim, verdict), label in zip(found, labels, strict=True):
        room = width - id_width - label_width - 4
        line = Text(f"{claim:<{id_width}}  ")
        line.append(f"{label:<{label_width}}", style=_style(verdict.label))
        line.append(shown.visible(f"  {_headline(verdict, room)}") if room > 10 else "")
        console.print(line, no_wrap=True, overflow="ellipsis")
    console.print(Text("The evidence in full: pytest -v, the report, `amp-harness list`."))
    for line in regressions(records):
        console.print(shown.text(line), style=KIND_STYLE[verdicts.REGRESSION])
    return console.file.getvalue()


def blocks(
    records: list[Record],
    width: int,
    color: bool,
    encoding: str | None = None,
    verbose: bool = False,
) -> str:
    """Each claim as a block that wraps at `width`: its ID and verdict on one line, then its
    evidence in full (`cap`ped), indented; where several tests checked it, or under -v
    (`verbose`), a line per test naming it and its status, and under -v where a claim from
    beyond the article comes from. Text from records is shown as data."""
    known = catalogue()
    console = _console(width, color, encoding)
    console.print(_title(records))
    for claim, verdict in _in_catalogue_order(records):
        head = Text(f"{claim}  ")
        head.append(against_expected(verdict.label, known.get(claim)), style=_style(verdict.label))
        console.print(head)
        lines = _evidence_lines(verdict, verbose)
        source = known.get(claim)
        if verbose and source is not None and source.catalogue != ARTICLE:
            lines.append(f"source: {source.source}")
        for line in lines:
            for wrapped in indented(shown.visible(line), width, INDENT):
                console.print(Text(wrapped), soft_wrap=True)  # wrapped already: never again
    for line in regressions(records):
        console.print(shown.text(line), style=KIND_STYLE[verdicts.REGRESSION])
    return console.file.getvalue()


def _evidence_lines(verdict: verdicts.ClaimVerdict, per_test: bool) -> list[str]:
    """The claim's evidence, each test's capped: the one test's text, or a line per test naming
    it and its status (`per_test`, or several tests)."""
    if len(verdict.statuses) == 1 and not per_test:
        return cap(verdict.statuses[0].evidence, IN_THE_JOURNAL).split("\n")
    return [
        f"[{s.label}] {s.test.split('::')[-1]}: {cap(s.evidence, IN_THE_JOURNAL)}"
        for s in verdict.statuses
    ]


def indented(text: str, width: int, indent: str, whole_words: bool = False) -> list[str]:
    """`text` wrapped at `width` terminal cells, each of its lines indented by `indent` and a
    line it wraps into by two more spaces. Lines break at spaces only (`->` and `2**-14` stay
    whole), and a wide character (CJK: the article's pitfall titles) counts as the two cells it
    takes. A word longer than a line gets a line of its own and is split there, after its last
    `::` that fits where it has one (a test id), unless `whole_words` (a path or a command to
    copy). textwrap counted characters and filled the rest of a line with the start of a long
    word: `test_grad` / `ient_explosion.py::...`."""
    out: list[str] = []
    for line in text.split("\n"):
        current, started = indent, False
        for space, word in re.findall(r"(\s*)(\S+)", line):
            if started and cell_len(current + space + word) <= width:
                current += space + word
                continue
            if started:
                out.append(current)
                current = indent + "  "
            current, started = current + word, True
            while not whole_words and cell_len(current) > width:
                head, current = _split(current, width, indent + "  ")
                out.append(head)
        out.append(current if started else indent.rstrip())
    return out


def _split(line: str, width: int, rest: str) -> tuple[str, str]:
    """`line`, over `width` cells, cut into what fits and the rest (a line of its own)."""
    fits = len(line)
    while cell_len(line[:fits]) > width:
        fits -= 1
    at = line.rfind("::", 0, fits - 1) + 2
    cut = at if at > len(rest) + 2 else fits  # after a `::`, unless that leaves a stub
    return line[:cut], rest + line[cut:]


def counts_line(records: list[Record]) -> str:
    """How many claims the session decided, by verdict, and what is counted."""
    found = _in_catalogue_order(records)
    counts = Counter(_kind(verdict) for _claim, verdict in found)
    by_kind = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items(), key=_count_order))
    return f"{len(found)} claim{'s' if len(found) != 1 else ''}: {by_kind} ({PER_CLAIM})."


def _headline(verdict: verdicts.ClaimVerdict, room: int) -> str:
    """The first test's evidence on one line, cut to `room` characters, and how many more
    tests checked the claim."""
    others = len(verdict.statuses) - 1
    more = f" (+{others} test{'s' if others > 1 else ''})" if others else ""
    return _one_line(verdict.statuses[0].evidence, room - len(more)) + more


def _kind(verdict: verdicts.ClaimVerdict) -> str:
    """What the counts count: the verdict, "mixed", "failed", "capability regression" or
    "skipped"."""
    if verdict.kind != verdicts.DECIDED_KIND:
        return verdict.kind
    return verdict.label.split(" ")[0]  # "refuted", or "mixed" of "mixed (partly, refuted)"


def _count_order(item: tuple[str, int]) -> tuple[int, str]:
    order = [*VERDICTS, verdicts.UNCOMPILED, "mixed", verdicts.FAILED, verdicts.REGRESSION]
    return (order.index(item[0]) if item[0] in order else len(order), item[0])


def render(records: list[Record], width: int, color: bool, encoding: str | None = None) -> str:
    """The full table (pytest -v): each test's status and evidence, shown as data."""
    table = Table(title=_title(records), expand=True)
    table.add_column("claim", max_width=24, overflow="fold")
    table.add_column("verdict", max_width=24, overflow="fold")
    table.add_column("evidence", ratio=1, overflow="fold")  # the evidence gets the room
    table.add_column("device", max_width=16, overflow="fold")
    known = catalogue()
    for claim, verdict, evidence, device in verdict_rows(records):
        # Text, never markup: evidence and test ids carry brackets.
        table.add_row(
            _claim_cell(claim, known.get(claim)),
            Text(against_expected(verdict, known.get(claim))),
            shown.text(evidence),
            shown.text(device),
            style=_style(verdict),
        )
    console = _console(width, color, encoding)
    console.print(table)
    for line in regressions(records):
        console.print(shown.text(line), style=KIND_STYLE[verdicts.REGRESSION])
    return console.file.getvalue()
