"""Known GPUs' datasheet peaks, and which entry a device is.

The table lives in gpus.json beside this module: per GPU, dense TFLOP/s for each format (plain
fp32 without TF32, tf32, fp16, bf16, fp8; null where the GPU has no such tensor cores) and the
memory bandwidth. A scenario reads it for the fraction of the peak it reached:

    gpu = identify(amp_device.name, amp_device.figures)   # devices.probe reads the figures
    if gpu.sure:
        fraction = achieved_tflops / gpu.spec.peak("fp16")
    # else: gpu.how says why the peaks are not trusted ("by name only: ...")

Variants of one model share a name stem and differ in peaks (an H200 NVL has 84% of an SXM
H200's tensor math and is named "NVIDIA H200 NVL"): entries that list `figures` (memory, SMs,
peak SM clock, maximum power limit) are told apart by them, and `identify` says when the figures
it could read do not decide.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.common.errors import HarnessError

TABLE_PATH = Path(__file__).with_name("gpus.json")
FORMATS = ("fp32", "tf32", "fp16", "bf16", "fp8")
_FIELDS = ("name", "match", "tflops", "bandwidth_tbs", "source")
_OPTIONAL_FIELDS = ("figures",)
# What a device reports that tells variants apart, with the unit each is written in.
FIGURES = {
    "total_memory_gib": "GiB of memory",
    "sm_count": "SMs",
    "max_sm_clock_mhz": "MHz peak SM clock",
    "max_power_w": "W maximum power limit",
}


@dataclass(frozen=True)
class GpuFigures:
    """What one device reports of the figures in FIGURES (None: could not be read here)."""

    total_memory_gib: float | None = None
    sm_count: float | None = None
    max_sm_clock_mhz: float | None = None
    max_power_w: float | None = None

    def read(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in FIGURES if getattr(self, k) is not None}


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
    figures: tuple[tuple[str, float, float], ...] = ()  # (figure, low, high) this variant shows

    def misfits(self, seen: dict[str, float]) -> list[str]:
        """The figures read on a device that this entry's ranges exclude, in words."""
        return [
            f"{_figure(key, seen[key])} (not {_figure_range(key, low, high)})"
            for key, low, high in self.figures
            if key in seen and not low <= seen[key] <= high
        ]

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
    unknown = sorted(set(entry) - set(_FIELDS) - set(_OPTIONAL_FIELDS))
    if missing or unknown:
        raise GpuTableError(
            f"{where}: missing field(s) {missing}, unknown field(s) {unknown}: the fields are "
            f"{', '.join(_FIELDS)} and, optional, {', '.join(_OPTIONAL_FIELDS)}"
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
        figures=_figures(where, entry.get("figures", {})),
    )


def _figures(where: str, figures) -> tuple[tuple[str, float, float], ...]:
    example = '{"max_power_w": [650, 750]}'
    if not isinstance(figures, dict):
        raise GpuTableError(
            f'{where}: field "figures" must be an object of [low, high] ranges, e.g. {example}'
        )
    ranges = []
    for key, bounds in figures.items():
        if key not in FIGURES:
            raise GpuTableError(
                f'{where}: field "figures.{key}" is not a known figure: use {", ".join(FIGURES)}'
            )
        if (
            not isinstance(bounds, list)
            or len(bounds) != 2
            or not all(_number(b) for b in bounds)
            or bounds[0] > bounds[1]
        ):
            raise GpuTableError(
                f'{where}: field "figures.{key}" must be a range [low, high] of two numbers, '
                f"low <= high, e.g. {example}; got {bounds!r}"
            )
        ranges.append((key, float(bounds[0]), float(bounds[1])))
    return tuple(ranges)


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


def _by_name(name: str, gpus: Sequence[GpuSpec]) -> tuple[str, GpuSpec] | None:
    """(the longest pattern that matched, its entry) for a CUDA device name, or None."""
    best: tuple[str, GpuSpec] | None = None
    for gpu in gpus:
        for m in gpu.match:
            if _matches(m, name) and (best is None or len(m) > len(best[0])):
                best = (m, gpu)
    return best


def spec(name: str, gpus: Sequence[GpuSpec] | None = None) -> GpuSpec | None:
    """The entry for a CUDA device name (the longest, most specific match wins), or None. By
    name alone: `identify` also checks the figures that tell variants apart."""
    named = _by_name(name, table() if gpus is None else gpus)
    return named[1] if named else None


@dataclass(frozen=True)
class Identified:
    """Which table entry a device is. `sure`: its peaks can be used; `how` says why, or why
    not, in words for the evidence."""

    spec: GpuSpec | None
    sure: bool
    how: str


def _figure(key: str, value: float) -> str:
    return f"{value:.4g} {FIGURES[key]}"


def _figure_range(key: str, low: float, high: float) -> str:
    return f"{low:g}-{high:g}" if low != high else f"{low:g}"


def identify(
    name: str, figures: GpuFigures | None, gpus: Sequence[GpuSpec] | None = None
) -> Identified:
    """The entry a device is, from its name and the figures it reports.

    The name picks an entry (the longest match). Its variants are the entries with `figures`
    whose match contains that pattern (an "H200" device's: H200 SXM and H200 NVL). An entry
    without figures is taken by name, as the table knows no variants of it. Otherwise the
    figures read must fit the entry and exclude every other variant; where they exclude the
    named entry and fit exactly one variant, that variant it is; where nothing read tells the
    variants apart, the named entry is returned unsure; where nothing fits, no entry."""
    table_ = table() if gpus is None else gpus
    named = _by_name(name, table_)
    if named is None:
        return Identified(None, False, f"{name!r} is not in harness/lab/machine/gpus.json")
    pattern, gpu = named
    if not gpu.figures:
        return Identified(gpu, True, f"{gpu.name}, by name ({pattern!r})")
    seen = figures.read() if figures else {}
    read = ", ".join(_figure(k, v) for k, v in seen.items()) or "none could be read"
    variants = [
        other
        for other in table_
        if other is gpu or (other.figures and any(_matches(pattern, m) for m in other.match))
    ]
    fitting = [v for v in variants if not v.misfits(seen)]
    names = " and ".join(v.name for v in variants)
    if fitting == [gpu]:
        ruled_out = "".join(
            f"; not {v.name}: {', '.join(v.misfits(seen))}" for v in variants if v is not gpu
        )
        return Identified(
            gpu, True, f"{gpu.name}, by name ({pattern!r}) and figures ({read}){ruled_out}"
        )
    if gpu in fitting:
        alike = " and ".join(v.name for v in fitting)
        return Identified(
            gpu,
            False,
            f"{gpu.name} by name only: its figures ({read}) fit {alike} alike, whose peaks "
            "differ; the maximum power limit (NVML) or the peak SM clock would tell them apart",
        )
    misfit = ", ".join(gpu.misfits(seen))
    if len(fitting) == 1:
        return Identified(
            fitting[0],
            True,
            f"{fitting[0].name}, by figures ({read}): the name reads {gpu.name} ({pattern!r}), "
            f"but {misfit}",
        )
    return Identified(
        None,
        False,
        f"the name reads {gpu.name} ({pattern!r}), but its figures ({read}) fit "
        f"{'none' if not fitting else ' and '.join(v.name for v in fitting)} of {names}",
    )
