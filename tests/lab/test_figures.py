"""harness.lab.figures draws what the evidence says: runs told apart when their lines coincide, a
constant panel said in words, a statistic on a log axis against its dtype's largest value with
the step it overflows. Checked on the figures as drawn (their axes, lines, legends, texts)."""

from __future__ import annotations

import math

from harness.lab.figures import against_limit, training_curves


def legend(ax) -> list[str]:
    return [text.get_text() for text in ax.get_legend().get_texts()]


def test_coinciding_runs_are_told_apart_and_a_constant_panel_is_a_sentence():
    fp32 = {"loss": [2.0, 1.5, 1.2], "scale": [1.0] * 3, "skipped": [False] * 3}
    bf16 = dict(fp32)  # the same numbers
    fp16 = {"loss": [2.0, 1.6, math.inf], "scale": [1.0] * 3, "skipped": [False] * 3}
    fig = training_curves({"fp32": fp32, "amp-bf16": bf16, "amp-fp16": fp16}, "t")
    loss, scale, skipped, _norm = fig.axes
    assert legend(loss) == [
        "fp32", "amp-bf16 (identical to fp32)", "amp-fp16 (non-finite from step 2)",
    ]  # fmt: skip
    styles = {(line.get_linestyle(), line.get_marker()) for line in loss.get_lines()}
    assert len(styles) == 3  # each run its own dash and marker
    for flat in (scale, skipped):  # every run constant: no lines, a sentence
        assert flat.get_lines() == [] and not flat.axison
        assert [t.get_text() for t in flat.texts] in (
            ["1 at every step in every run"], ["0 at every step in every run"],
        )  # fmt: skip


def test_a_statistic_is_drawn_on_a_log_axis_against_its_dtypes_largest_value():
    traces = {"std 256": [4e4, 6e4, 6.5e4], "std 257": [4.1e4, 6.5e4, math.inf]}
    fig = against_limit(traces, "running_var", "running_var", 65504.0, "fp16's largest, 65504")
    (ax,) = fig.axes
    assert ax.get_yscale() == "log"
    assert legend(ax) == [
        "std 256 (finite for 3 steps)", "std 257 (inf at step 3)", "fp16's largest, 65504",
    ]  # fmt: skip
    limit = [line for line in ax.get_lines() if list(line.get_ydata()) == [65504.0, 65504.0]]
    assert limit  # the horizontal line at the limit
    marks = [line for line in ax.get_lines() if line.get_marker() == "X"]
    assert [(list(m.get_xdata()), list(m.get_ydata())) for m in marks] == [([3], [65504.0])]
