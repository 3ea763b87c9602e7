"""MLflow stores for tests that read them (the report, the MLflow UI): sessions and test runs
logged through the live code path (MlflowSink), as the plugin logs them."""

from __future__ import annotations

from pathlib import Path

from harness.records.journal_index import EXPERIMENTAL, MARK, mark
from harness.records.record import Record
from harness.records.tracking import MlflowSink

CPU = {
    "device": "cpu", "gpu_name": "n/a", "gpu_count": "0", "compute_capability": "n/a",
    "driver": "n/a", "cuda": "n/a", "cudnn": "n/a", "nccl": "n/a", "torch": "2.13.0+cpu",
    "python": "3.11.7", "platform": "Linux", "cpu": "x86_64", "harness": "0.1.0",
    "git_commit": "0123456789ab", "tf32.cuda.matmul.allow_tf32": "False",
    "tf32.cudnn.allow_tf32": "True",
}  # fmt: skip
GPU = {**CPU, "device": "cuda", "gpu_name": "NVIDIA H200", "gpu_count": "1",
       "compute_capability": "9.0", "cuda": "12.8", "torch": "2.11.0"}  # fmt: skip
CPU_LABEL, GPU_LABEL = "cpu-x86-64 / torch 2.13.0+cpu", "NVIDIA H200 / torch 2.11.0 / CUDA 12.8"


def png(folder: Path) -> Path:
    """A small real PNG, written once per folder and shared by the records that log it."""
    from matplotlib.figure import Figure

    path = folder / "curve.png"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        fig = Figure(figsize=(3, 2))
        fig.subplots().plot([0, 1, 2], [2.0, 1.0, 0.5])
        fig.savefig(path, dpi=50)
    return path


def make_record(test, claims, outcome="passed", message="", verdicts=(), figure_dir=None):
    record = Record(test=f"scenarios/{test}", claims=list(claims), device="synthetic",
                    artifact_dir=figure_dir or Path("/nonexistent"))  # fmt: skip
    for claim, verdict, evidence in verdicts:
        record.verdict(claim, verdict, evidence)
    if figure_dir:
        record.figures.append(png(figure_dir).name)
    record.metric(loss=1.5)
    record.outcome, record.message, record.ended = outcome, message, record.started + 1
    return record


def log_session(
    sink: MlflowSink,
    facts: dict,
    started: float,
    records: list[Record],
    exitstatus: int | None = 0,
    left_out: tuple[str, ...] = (),
    experimental: str | None = None,
) -> dict:
    """A session as the plugin logs it; `exitstatus` None: killed before its end was logged;
    `left_out`: it ran part of the suite (-k); `experimental`: marked so (--amp-experimental),
    for that reason. Its entry."""
    session = {"session_id": f"s{started:.0f}-{facts['device']}", "name": f"session {started:.0f}",
               "started": started, "args": [], "fingerprint": facts}  # fmt: skip
    if experimental is not None:
        session[MARK] = mark(EXPERIMENTAL, experimental, started)
    sink.start_session(session)
    for record in records:
        record.started, record.ended = started + 1, started + 2
        sink.log_record(session, record)
    if exitstatus is not None:
        end = {"ended": started + 60, "exitstatus": exitstatus, "counts": {"passed": len(records)},
               "left_out": list(left_out)}  # fmt: skip
        sink.end_session(session, end)
    assert sink.down is None, sink.down
    return session
