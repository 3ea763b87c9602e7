"""Figures that several scenarios log: training curves side by side, per recipe."""

from __future__ import annotations

import math

from matplotlib.figure import Figure

# The article's early-warning signals (PRACTICE-SMOKE), in the order a person reads them.
PANELS = (
    ("loss", "loss", "log"),  # log: an exploding run's loss would flatten the healthy one
    ("scale", "loss scale", "log"),
    ("skipped", "skipped steps (cumulative)", "linear"),
    ("grad_norm", "grad norm after unscaling", "log"),
)


def training_curves(runs: dict[str, dict[str, list]], title: str, panels=PANELS) -> Figure:
    """One panel per signal against the step, one line per run (label -> History.as_dict())."""
    fig = Figure(figsize=(4 * len(panels), 3.4), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (key, label, yscale) in zip(axes, panels, strict=True):
        for name, history in runs.items():
            values = history.get(key, [])
            if key == "skipped":
                values = [sum(values[: i + 1]) for i in range(len(values))]
            broken = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
            # A line stops at the first inf/NaN: say where, rather than let it vanish.
            legend = name if broken is None else f"{name} (non-finite from step {broken})"
            ax.plot(range(len(values)), values, label=legend, linewidth=1.2)
        ax.set(title=label, xlabel="step", yscale=yscale)
    for ax in axes:
        ax.legend(fontsize="x-small")
    fig.suptitle(title)
    return fig
