"""The report: reads MLflow (never the scenarios, never the journal) and writes reports/<name>/.

- `index.html`: self-contained (styles inline, figures as base64 data URIs; it loads nothing from
  the network), rendered by Jinja2 with autoescape on: every run's text reaches it as text.
- `summary.md`: the same ledger as a markdown table, for a pull request or a wiki page.
- the figures as PNG files: the scenarios' figures and an overview of the verdicts.

What it shows: the verdict ledger (every claim of the catalogue x every environment found),
the claims run without a verdict apart from those no test has run, each scenario's figures
grouped by test, and a comparison passed in by the caller (`comparison=`; harness.reports.compare
builds it).

The ledger is harness.reports.ledger's model, read from MLflow by harness.reports.ledger_read
(the runs into columns and cells, the sessions marked experimental apart, the history's input;
which run a column shows is told in ledger_columns, when a session is complete in
ledger_sessions). This module renders it: the page through
`templates/report.html.j2`, summary.md, the figures, and the folder that replaces the last one
(`build`, `report_dir`).
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import harness
from harness.common import filenames, shown
from harness.common.errors import HarnessError
from harness.records import tracking
from harness.records.tracking import DEFAULT_EXPERIMENT
from harness.reports import atlas, baseline, history, known_bugs, ledger_read, table
from harness.reports.ledger import COLOURS, MIXED, Environment, plural, when
from harness.reports.ledger_read import reading
from harness.reports.table import PER_CLAIM_AND_TEST

DEFAULT_NAME = "report"  # a fixed name, overwritten by the next build: a stable path to bookmark
TEMPLATE = "report.html.j2"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
HARDWARE_NOTE = "differs with the hardware"

Comparison = str | Sequence[Mapping[str, object]] | None


@dataclass
class Figure:
    test: str
    name: str  # the artifact's file name
    file: str  # the PNG's name inside the report folder
    data_uri: str


def build(
    tracking_uri: str,
    out: Path,
    experiment: str = DEFAULT_EXPERIMENT,
    comparison: Comparison = None,
) -> Path:
    """Write the report into the folder `out` (replaced whole if it holds an earlier report) and
    return the path of its index.html.

    `comparison` is the hook for harness.reports.compare: a line of text (escaped in summary.md, as
    preformatted text in the HTML: it quotes session names, paths and what was wrong with a
    baseline, all data) or a list of rows (dicts with the same keys), shown as a table.
    """
    out = Path(out)
    _check_target(out)
    found = ledger_read.read(tracking_uri, experiment)
    environments = found.environments
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    work.chmod(0o755)  # mkdtemp's 0o700 would hide the report from the people it is for
    try:
        with reading(tracking_uri, "downloading the figures"), tracking.progress_bars_off():
            figures = [_figures(env, tracking_uri, work, i) for i, env in enumerate(environments)]
        counts = found.counts
        overview = _overview(environments, counts, work) if environments else None
        context = {
            "title": "amp-harness verdict report",
            "built": when(found.built),
            "source": tracking.redact(tracking_uri),
            "experiment": experiment,
            "ui": found.ui,
            "runs_url": found.runs_url,
            "runs_view": found.view,
            "harness_version": harness.__version__,
            "environments": environments,
            "experimental": found.experimental,
            "experimental_words": baseline.experimental_words,
            "classes": found.classes,
            "hardware_note": HARDWARE_NOTE,
            "counts": counts,
            "counted": PER_CLAIM_AND_TEST,  # the words the session's last lines count claims in
            "ledger": found.rows,
            "differences": found.differences,
            "atlas": found.atlas,
            "atlas_cell": atlas.cell_text,
            "history": found.history,
            "history_rows": found.history_rows,
            "history_shown": history.SHOWN,
            "trend_size": (history.WIDTH, history.HEIGHT),
            "mixed": MIXED,
            "uncovered": found.uncovered,
            "undecided": found.undecided,
            "diagnoses": found.diagnoses,
            "regressions": found.regressions,
            "known_bugs": known_bugs.report_rows(found.rows, environments),
            "unknown": found.unknown,
            "figures": figures,
            "overview": overview,
            "comparison": comparison,
            "comparison_columns": _columns(comparison),
            "verdict_order": list(COLOURS),
            "evidence_chars": f"{table.EVIDENCE_CHARS:,}",
            "colours": COLOURS,
        }
        (work / "index.html").write_text(_render(context), encoding="utf-8")
        (work / "summary.md").write_text(_markdown(context), encoding="utf-8")
        _replace(out, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out / "index.html"


def report_dir(reports: Path, name: str = DEFAULT_NAME) -> Path:
    """reports/<name>, for a name that is one plain folder name, short enough for the file
    system with the temporary names built beside it (`_replace`, `build`'s mkdtemp)."""
    if not _NAME.fullmatch(name):
        raise HarnessError(
            f"--name {name!r}: use one folder name of letters, digits, '.', '_' or '-' "
            f"(e.g. {DEFAULT_NAME} or 2025-06-01-h200)"
        )
    longest = filenames.name_max(reports) - len(_old_name("", 2**22))  # pid_max: 7 digits
    if len(name) > longest:
        raise HarnessError(
            f"--name of {len(name)} characters is too long: the report folder and the "
            f"temporary one beside it must fit the file names of {reports}, so the name takes "
            f"at most {longest}; pick a shorter one, e.g. --name {name[:40]}"
        )
    return Path(reports) / name


def _check_target(out: Path) -> None:
    """Only a folder that holds an earlier report is replaced: never reports/records, the
    artifact store or a user's own folder."""
    if out.exists() and not (out.is_dir() and (out / "index.html").is_file()):
        raise HarnessError(
            f"{out} exists and is not an amp-harness report (no index.html): pass another --name"
        )


def _old_name(name: str, pid: int) -> str:
    """Where the earlier report is moved while the new one takes its place."""
    return f".{name}-old-{pid}"


def _replace(out: Path, work: Path) -> None:
    old = None
    if out.exists():
        old = out.with_name(_old_name(out.name, os.getpid()))
        out.rename(old)
    work.rename(out)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def _figures(env: Environment, uri: str, work: Path, index: int) -> list[Figure]:
    """Download the figures/*.png of the session's tests into the report folder.

    Through the run's artifact URI, which search_runs already returned: MlflowClient's
    run-id path looks the run up again (two queries and a logged-model lookup per call, about
    13 ms a run on SQLite), which alone would take a 1,000-run report past its 10 s budget."""
    import mlflow.artifacts

    figures = []
    for run in env.tests:
        root = run.info.artifact_uri.rstrip("/")
        listed = mlflow.artifacts.list_artifacts(artifact_uri=f"{root}/figures", tracking_uri=uri)
        test = run.data.tags.get("amp.test", run.info.run_name)
        for info in listed:
            name = info.path.rsplit("/", 1)[-1]
            if info.is_dir or not name.endswith(".png"):
                continue
            local = mlflow.artifacts.download_artifacts(
                artifact_uri=f"{root}/{info.path}",
                dst_path=str(work / ".download"),
                tracking_uri=uri,
            )
            data = Path(local).read_bytes()
            file = f"env{index + 1}-{_slug(test)}-{name}"
            (work / file).write_bytes(data)
            figures.append(Figure(test, name, file, _data_uri(data)))
    shutil.rmtree(work / ".download", ignore_errors=True)
    return figures


def _overview(environments: list[Environment], counts: list[Counter], work: Path) -> Figure:
    """Verdict counts per environment, as stacked bars coloured as in the ledger."""
    from matplotlib.figure import Figure as MplFigure

    fig = MplFigure(figsize=(9, 0.6 + 0.55 * len(environments)), layout="constrained")
    ax = fig.subplots()
    labels = [env.label for env in environments]  # distinct (_disambiguate): barh merges equal ones
    left = [0] * len(environments)
    for kind, colour in COLOURS.items():
        widths = [c.get(kind, 0) for c in counts]
        if any(widths):
            ax.barh(labels, widths, left=left, color=colour, label=kind)
            left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel(f"verdicts in the ledger ({PER_CLAIM_AND_TEST})")
    ax.legend(ncols=6, fontsize="small", loc="lower left", bbox_to_anchor=(0, 1.02))
    file = "verdicts.png"
    fig.savefig(work / file, dpi=100)
    return Figure("", "verdicts per environment", file, _data_uri((work / file).read_bytes()))


# --- rendering -------------------------------------------------------------------------------


def _render(context: dict) -> str:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).with_name("templates")),
        autoescape=True,  # always: run names, tags and evidence are text, never markup
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return env.get_template(TEMPLATE).render(context)


def _markdown(context: dict) -> str:
    environments = context["environments"]
    lines = [
        f"# {context['title']}",
        "",
        f"Built {context['built']} from {context['source']} (experiment "
        f"`{context['experiment']}`): per environment, each test's latest run since its latest "
        "complete session, with the session it came from. Evidence longer than "
        f"{context['evidence_chars']} characters is cut: each entry's MLflow run holds it "
        "whole (record.json).",
        "",
    ]
    for env in environments:
        tests = plural(len(env.tests), "test")
        lines.append(f"- **{_md(env.label)}**: {tests}; {_md(_machine_line(env))}")
        lines += [
            f"  - session of {s.when} (commit {_md(s.commit)}): {plural(s.shown, 'test')}"
            + (f"; incomplete: {_md(s.incomplete)}" if s.incomplete else "")
            for s in env.sessions
        ]
    if not environments:
        lines.append(
            "No session of record in this experiment yet: only experimental ones (below)."
            if context["experimental"]
            else "No harness runs in this experiment yet."
        )
    if context["experimental"]:
        lines += ["", "## Experimental sessions, kept out of the ledger", ""]
        lines += [
            f"- {_md(label)}: session of {s.when}, {s.age} (commit {_md(s.commit)}), "
            f"{plural(len(s.runs), 'test')}: {_md(baseline.experimental_words(s.experimental))}"
            for label, s in context["experimental"]
        ]
    lines += ["", "## Verdict ledger", ""]
    if environments:
        grouped = "; ".join(
            f"{name} ({plural(span, 'column')}{', a name only' if legacy else ''})"
            for name, span, legacy in context["classes"]
        )
        lines += [f"Columns by hardware class: {_md(grouped)}.", ""]
    lines.append("| claim | " + " | ".join(_md(env.label) for env in environments) + " |")
    lines.append("|---" * (len(environments) + 1) + "|")
    for claim, cells in context["ledger"]:
        difference = context["differences"].get(claim.id)
        marked = difference.hardware_columns if difference else []
        row = [
            "<br>".join(
                ([f"**{_md(cell.verdict.label)}**"] if len(cell.entries) > 1 else [])
                + [
                    f"[{_md(e.verdict)}]({e.url}): {_md(e.evidence)} "
                    f"({_md(e.test.split('::')[-1])}; {e.session.when}, {e.session.age})"
                    for e in cell.entries
                ]
            )
            or "not run"
            for cell in cells
        ]
        row = [
            f"{text}<br>*{HARDWARE_NOTE}*" if env.label in marked else text
            for env, text in zip(environments, row, strict=True)
        ]
        lines.append(f"| {claim.id} | " + " | ".join(row) + " |")
    lines += _known_bugs_markdown(context)
    lines += ["", "## Differences between environments", ""]
    lines += [
        f"- **{cid}**: {_md(difference.summary())}"
        for cid, difference in context["differences"].items()
    ] or ["The environments agree on every claim they decided, key metrics included."]
    lines += _history_markdown(context)
    lines += ["", "## Autocast atlas", "", *atlas.markdown(context["atlas"])]
    regressions = [
        f"- {_md(env.label)}: {_md(what)} (tests {_md(tests)}; claims {_md(claims)})"
        for env, found in zip(environments, context["regressions"], strict=True)
        for what, tests, claims in found
    ]
    if regressions:
        lines += ["", "## Capability regressions", ""] + regressions
    lines += ["", "## Claims run without a verdict (skipped here, or failed)", ""]
    lines += [f"- {cid}: {_md(why)}" for cid, _statement, why in context["undecided"]] or [
        "Every claim that ran has a verdict."
    ]
    lines += ["", "## Claims no test has run", ""]
    lines += [f"- {cid}: {_md(why)}" for cid, _statement, why in context["uncovered"]] or [
        "A test of every claim has run."
    ]
    for d in context["diagnoses"]:
        lines += ["", f"## Diagnosis of {_md(d['factory'])} on {_md(d['device'])}, torch "
                  f"{_md(d['torch'])} ({d['when']})", ""]  # fmt: skip
        lines += [f"- {recipe}: **{status}**: {_md(why)}" for recipe, status, why in d["recipes"]]
    comparison = context["comparison"]
    if comparison is not None:
        lines += ["", "## Comparison", ""]
        if isinstance(comparison, str):  # it quotes session names and paths: data too
            lines.append(_md(comparison))
        else:
            columns = context["comparison_columns"]
            lines.append("| " + " | ".join(_md(c) for c in columns) + " |")
            lines.append("|---" * len(columns) + "|")
            lines += [
                "| " + " | ".join(_md(str(row.get(c, ""))) for c in columns) + " |"
                for row in comparison
            ]
    figures = [f for group in context["figures"] for f in group]
    if context["overview"]:
        figures.insert(0, context["overview"])
    if figures:
        lines += ["", "## Figures", ""]
        lines += [f"- [{_md(f.test or f.name)}: {f.name}]({f.file})" for f in figures]
    return "\n".join(lines) + "\n"


def _known_bugs_markdown(context: dict) -> list[str]:
    """The known bugs x environments, a present cell in bold, the workaround beside each."""
    lines = ["", "## Known bugs", ""]
    rows = context["known_bugs"]
    if not rows:
        return lines + ["No environment ran the known bugs' reproductions."]
    envs = context["environments"]
    lines.append("| bug | " + " | ".join(_md(env.label) for env in envs) + " | workaround |")
    lines.append("|---" * (len(envs) + 2) + "|")
    for row in rows:
        states = [
            f"**{_md(state)}**" if row.present(i) else _md(state)
            for i, state in enumerate(row.states)
        ]
        lines.append(
            f"| {row.bug.id}: {_md(row.bug.harm)} | "
            + " | ".join(states)
            + f" | {_md(row.bug.workaround)} |"
        )
    return lines


def _history_markdown(context: dict) -> list[str]:
    """The history's section of summary.md: a line per class, then per claim a line per class
    that ran it. A list, not a table: a reader of summary.md finds a claim's ledger row by its
    `| CLAIM |`, and the ledger's is the one table of claims."""
    timeline = context["history"]
    lines = [
        "", "## History per hardware class", "",
        "Per claim and class: its verdict in the latest session that ran it, since when it has "
        "held (sessions marked experimental left out), and where it changed over the last "
        f"{context['history_shown']} sessions of the class its verdicts in order and each key "
        "metric that took more than one value, a block per session (`amp-harness compare "
        "--range A..B`: what changed at which session).", "",
    ]  # fmt: skip
    if not timeline:
        return [*lines, "No session of record yet."]
    for found in timeline:
        changed = ", ".join(found.changed())
        lines.append(f"- **{_md(found.name)}**: {_md(found.words())}"
                     + (f"; changed: {_md(changed)}" if changed else ""))  # fmt: skip
    lines.append("")
    for claim, tracks in context["history_rows"]:
        lines.append(f"- **{claim.id}**")
        lines += [
            f"  - {_md(found.name)}: {_track_markdown(track)}"
            for found, track in zip(timeline, tracks, strict=True)
            if track is not None
        ]
    return lines


def _track_markdown(track: history.Track) -> str:
    parts = [f"**{_md(track.label)}** {_md(track.since_words())}"]
    if len(track.stretches) > 1:
        parts.append(_md(track.stretch_words()))
    parts += [f"{_md(t.label)}: {t.blocks()} {_md(t.words())}" for t in track.trends]
    return "; ".join(parts)


def _machine_line(env: Environment) -> str:
    """The column's class and the facts of its machine, in one line."""
    legacy = " (only a name: recorded before hardware classes)" if env.legacy else ""
    facts = "".join(f"; {what}: {value}" for what, value in env.machine)
    return f"class {env.hardware_class}{legacy}{facts}"


def _columns(comparison: Comparison) -> list[str]:
    if comparison is None or isinstance(comparison, str):
        return []
    return list(dict.fromkeys(key for row in comparison for key in row))


def _md(text: str) -> str:
    """Text in a markdown table cell: no markup (no link, image or raw HTML from a claim, evidence
    or a baseline), no cell break, no line break."""
    return shown.markdown(text)


def _slug(test: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", test.removeprefix("scenarios/")).strip("_")


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")
