"""Known GPUs' datasheet peaks, and the decisions that speed measurements against them make.

The table lives in gpus.json beside this module: per GPU, dense TFLOP/s for each format (plain
fp32 without TF32, tf32, fp16, bf16, fp8; null where the GPU has no such tensor cores) and the
memory bandwidth. A scenario reads it for the fraction of the peak it reached:

    gpu = spec(torch.cuda.get_device_properties(0).name)   # None for a GPU not in the table
    fraction = achieved_tflops / gpu.peak("fp16") if gpu and gpu.peak("fp16") else None
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError

TABLE_PATH = Path(__file__).with_name("gpus.json")
FORMATS = ("fp32", "tf32", "fp16", "bf16", "fp8")
_FIELDS = ("name", "match", "tflops", "bandwidth_tbs", "source")


class GpuTableError(HarnessError):
    pass


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's datasheet: dense TFLOP/s per format (None: no such math) and TB/s."""

    name: str
    match: tuple[str, ...]  # substrings of the CUDA device name, matched as whole words
    fp32: float  # CUDA cores, TF32 off
    tf32: float | None
    fp16: float | None
    bf16: float | None
    fp8: float | None
    bandwidth_tbs: float
    source: str

    def peak(self, fmt: str) -> float | None:
        """Dense TFLOP/s for one of FORMATS."""
        if fmt not in FORMATS:
            raise HarnessError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
        return getattr(self, fmt)


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _entry(path: Path, index: int, entry) -> GpuSpec:
    where = f"{path}: gpus[{index}]"
    if not isinstance(entry, dict):
        raise GpuTableError(f"{where}: expected an object with fields {', '.join(_FIELDS)}")
    if isinstance(entry.get("name"), str) and entry["name"].strip():
        where += f" ({entry['name']})"
    missing = [f for f in _FIELDS if f not in entry]
    unknown = sorted(set(entry) - set(_FIELDS))
    if missing or unknown:
        raise GpuTableError(
            f"{where}: missing field(s) {missing}, unknown field(s) {unknown}: the fields are "
            f"{', '.join(_FIELDS)}"
        )
    for field in ("name", "source"):
        if not isinstance(entry[field], str) or not entry[field].strip():
            raise GpuTableError(f'{where}: field "{field}" must be non-empty text')
    match = entry["match"]
    if (
        not isinstance(match, list)
        or not match
        or not all(isinstance(m, str) and m.strip() for m in match)
    ):
        raise GpuTableError(
            f'{where}: field "match" must be a non-empty list of non-empty substrings of the '
            f'CUDA device name, e.g. ["H100"]'
        )
    tflops = entry["tflops"]
    if not isinstance(tflops, dict) or set(tflops) != set(FORMATS):
        got = sorted(tflops) if isinstance(tflops, dict) else type(tflops).__name__
        raise GpuTableError(
            f'{where}: field "tflops" must be an object with exactly the formats '
            f"{', '.join(FORMATS)} (null where the GPU has none), got {got}"
        )
    for fmt in FORMATS:
        value = tflops[fmt]
        if value is None and fmt != "fp32":
            continue
        if not _number(value) or value <= 0:
            allowed = "a positive number" + ("" if fmt == "fp32" else " or null")
            raise GpuTableError(f'{where}: field "tflops.{fmt}" must be {allowed}, got {value!r}')
    bandwidth = entry["bandwidth_tbs"]
    if not _number(bandwidth) or bandwidth <= 0:
        raise GpuTableError(
            f'{where}: field "bandwidth_tbs" must be a positive number of TB/s, got {bandwidth!r}'
        )
    return GpuSpec(
        name=entry["name"],
        match=tuple(match),
        **{fmt: tflops[fmt] for fmt in FORMATS},
        bandwidth_tbs=bandwidth,
        source=entry["source"],
    )


def load_table(path: Path) -> tuple[GpuSpec, ...]:
    """Read and validate a GPU table; every problem names the file, the entry and the field."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise GpuTableError(f"{path}: cannot read the GPU table: {exc}") from exc
    entries = doc.get("gpus") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise GpuTableError(f'{path}: expected an object with a non-empty "gpus" list')
    specs: list[GpuSpec] = []
    owner: dict[str, str] = {}  # lower-cased match string -> the entry that claims it
    for index, entry in enumerate(entries):
        gpu = _entry(path, index, entry)
        if any(gpu.name == other.name for other in specs):
            raise GpuTableError(f'{path}: gpus[{index}]: name "{gpu.name}" appears twice')
        for m in gpu.match:
            if m.lower() in owner:
                raise GpuTableError(
                    f'{path}: gpus[{index}] ({gpu.name}): field "match": "{m}" is already a '
                    f"match of {owner[m.lower()]}: a device name would be ambiguous"
                )
            owner[m.lower()] = gpu.name
        specs.append(gpu)
    return tuple(specs)


@functools.cache
def table() -> tuple[GpuSpec, ...]:
    """The project's GPU table, loaded once per process."""
    return load_table(TABLE_PATH)


def _matches(pattern: str, name: str) -> bool:
    """`pattern` occurs in `name` as a whole word: not followed or preceded by a letter or
    digit, so "L4" does not match "NVIDIA L40S" nor "H100" "NVIDIA H1000"."""
    word = rf"(?<![A-Za-z0-9]){re.escape(pattern)}(?![A-Za-z0-9])"
    return re.search(word, name, re.IGNORECASE) is not None


def spec(name: str, gpus: Sequence[GpuSpec] | None = None) -> GpuSpec | None:
    """The entry for a CUDA device name (the longest, most specific match wins), or None."""
    best: tuple[int, GpuSpec] | None = None
    for gpu in table() if gpus is None else gpus:
        for m in gpu.match:
            if _matches(m, name) and (best is None or len(m) > best[0]):
                best = (len(m), gpu)
    return best[1] if best else None
