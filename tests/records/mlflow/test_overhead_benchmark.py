"""scripts/bench-overhead in the slow tier (issue 56): the harness's own cost, MLflow against the
journal alone, as ratios in pytest-benchmark's extra_info (--benchmark-json keeps them), never
judged: a loaded runner's seconds are no measure. What is asserted is that the script measured
what it says (every pair, the medians, sync's rate, --help). At its stated scale (--stated-scale)
the whole quick tier, three pairs and 5,000 records; else one scenario module, one pair and 200
records: the same lines in a fraction of the time."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import REPO

SCRIPT = REPO / "scripts" / "bench-overhead"
MEDIAN = re.compile(
    r"median of (\d+) pairs: wall ([\d.]+)x .* CPU ([\d.]+)x .* peak RSS ([+-]\d+) MiB"
)
SYNC = re.compile(r"sync of ([\d,]+) records into an empty store: .* ([\d.]+) records/s")
# The writer's process alone: what the largest-process RSS above leaves out
WRITER = re.compile(r"the writer's own process, \d+ results: CPU ([\d.]+) s .* peak RSS (\d+) MiB"
                    r".*; MLflow got all")  # fmt: skip


@pytest.mark.slow
def test_overhead_benchmark_prints_its_ratios(benchmark, stated_scale):
    scale = [] if stated_scale else ["--pairs", "1", "--sync", "200",
                                     "--scenarios", "scenarios/test_formats.py"]  # fmt: skip
    command = [sys.executable, str(SCRIPT), "--only", "help", "--only", "tier", "--only", "sync"]
    done = benchmark.pedantic(
        subprocess.run, args=([*command, *scale],),
        kwargs={"capture_output": True, "text": True, "timeout": 1800}, rounds=1, iterations=1,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    print(done.stdout)
    pairs, wall, cpu, rss = MEDIAN.search(done.stdout).groups()
    records, rate = SYNC.search(done.stdout).groups()
    writer_cpu, writer_rss = WRITER.search(done.stdout).groups()
    assert (
        len(re.findall(r"^  pair \d+ ", done.stdout, re.M))
        == int(pairs)
        == (3 if stated_scale else 1)
    )
    assert "amp-harness --help: fastest of 5 " in done.stdout
    benchmark.extra_info.update(
        pairs=int(pairs), wall_ratio=float(wall), cpu_ratio=float(cpu), peak_rss_mib=int(rss),
        sync_records=int(records.replace(",", "")), sync_records_per_s=float(rate),
        writer_cpu_s=float(writer_cpu), writer_peak_rss_mib=int(writer_rss),
    )  # fmt: skip
