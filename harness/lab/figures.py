"""Figures that several scenarios log: training curves side by side, per recipe, a statistic
against the largest value its dtype holds, and speed-ups with their intervals against a size.

Read as evidence, a figure must not hide a run: runs get distinct line styles and markers, a
run whose values coincide with an earlier one's says so in the legend ("amp-bf16 (identical to
fp32)"), and a panel where every run is constant (no step skipped anywhere) is a sentence
instead of flat lines.
"""

from __future__ import annotations

import math

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

# The article's early-warning signals (PRACTICE-SMOKE), in the order a person reads them.
PANELS = (
    ("loss", "loss", "log"),  # log: an exploding run's loss would flatten the healthy one
    ("scale", "loss scale", "log"),
    ("skipped", "skipped steps (cumulative)", "linear"),
    ("grad_norm", "grad norm after unscaling", "log"),
)
STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "x", "d", "v")


def _style(index: int, points: int) -> dict:
    return {
        "linestyle": STYLES[index % len(STYLES)],
        "marker": MARKERS[index % len(MARKERS)],
        # About ten markers a line, offset per run: coinciding lines stay told apart.
        "markevery": (index % 3, max(1, points // 10)),
        "markersize": 3,
        "linewidth": 1.2,
    }


def _same(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(
        x == y or (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=1e-9)
        for x, y in zip(a, b, strict=True)
    )


def training_curves(runs: dict[str, dict[str, list]], title: str, panels=PANELS) -> Figure:
    """One panel per signal against the step, one line per run (label -> History.as_dict())."""
    fig = Figure(figsize=(4 * len(panels), 3.4), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (key, label, yscale) in zip(axes, panels, strict=True):
        series = {}
        for name, history in runs.items():
            values = [float(v) for v in history.get(key, [])]
            if key == "skipped":
                values = [sum(values[: i + 1]) for i in range(len(values))]
            series[name] = values
        constant = {v for values in series.values() for v in values}
        if len(constant) <= 1:  # every run flat at one value: a sentence says it better
            value = next(iter(constant), None)
            ax.axis("off")
            ax.set_title(label)
            text = "no data" if value is None else f"{value:g} at every step in every run"
            ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, transform=ax.transAxes)
            continue
        for index, (name, values) in enumerate(series.items()):
            twin = next((n for n in list(series)[:index] if _same(series[n], values)), None)
            broken = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
            # A line stops at the first inf/NaN: say where, rather than let it vanish.
            legend = name if broken is None else f"{name} (non-finite from step {broken})"
            if twin is not None:
                legend += f" (identical to {twin})"
            ax.plot(range(len(values)), values, label=legend, **_style(index, len(values)))
        ax.set(title=label, xlabel="step", yscale=yscale)
        ax.legend(fontsize="x-small")
    fig.suptitle(title)
    return fig


def against_limit(
    traces: dict[str, list[float]], title: str, ylabel: str, limit: float, limit_label: str
) -> Figure:
    """Each trace against the step on a log axis, with the dtype's `limit` drawn across: a trace
    that becomes inf ends with a mark on the limit, its legend naming the step."""
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    for index, (name, values) in enumerate(traces.items()):
        broken = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
        line = ax.plot(range(1, len(values) + 1), values, **_style(index, len(values)))[0]
        if broken is None:
            line.set_label(f"{name} (finite for {len(values)} steps)")
        else:
            line.set_label(f"{name} (inf at step {broken + 1})")
            ax.plot([broken + 1], [limit], marker="X", markersize=8, color=line.get_color())
    ax.axhline(limit, color="black", linewidth=0.8, linestyle="--", label=limit_label)
    ax.set(title=title, xlabel="step", ylabel=ylabel, yscale="log")
    ax.legend(fontsize="x-small")
    return fig


def speedups(
    sizes: list[float],
    series: dict[str, list],
    xlabel: str,
    ylabel: str,
    title: str,
    lines: dict[float, str] | None = None,
    dashed: set[str] = frozenset(),
) -> Figure:
    """Speed-ups (harness.lab.measure.Ratio: value and interval) against a size, log-log, one
    line per series with its intervals as error bars; `lines`: horizontal marks (a threshold, a
    target) by value and label, besides 1x; `dashed`: series drawn dashed (an A/A control)."""
    fig = Figure(figsize=(6.4, 4.4), layout="constrained")
    ax = fig.subplots()
    for name, ratios in series.items():
        ax.errorbar(
            sizes,
            [r.value for r in ratios],
            yerr=[
                [max(0.0, r.value - r.low) for r in ratios],
                [max(0.0, r.high - r.value) for r in ratios],
            ],  # fmt: skip
            label=name.replace("_over_", " over "),
            marker="o",
            capsize=3,
            linestyle="--" if name in dashed else "-",
        )
    ax.axhline(1.0, color="grey", linewidth=0.8)
    for value, label in (lines or {}).items():
        ax.axhline(value, color="grey", linewidth=0.8, linestyle=":", label=label)
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel=ylabel, title=title)
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))  # 0.5x 1x 2x 5x 10x ...
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _position: f"{value:g}x"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.legend(fontsize="x-small")
    return fig
