"""PyTorch's documented autocast op lists, per device and release (lists.toml, cited).

`documented("cpu", "2.13.0+cpu")` is what the "Autocast Op Reference" of that release's docs
says: op name -> the list that names it ("lower", "float32" or "promote"). The CPU's float16
shares the bfloat16 lists (documented since 2.5, the release that brought CPU float16 autocast);
CUDA's lists name float16 and hold for bfloat16 too. A release newer than the last one read is
given the last one's lists, and says so (`Documented.note`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from harness.common.toml import tomllib
from harness.common.versions import release_of, release_text

LISTS_PATH = Path(__file__).with_name("lists.toml")
LISTS = ("lower", "float32", "promote")
NO_LIST = "no list"
# How the atlas keeps a behaviour as a metric (one per op), so that the report and `baseline
# changes` read it back from MLflow and baselines without importing torch.
CODES = {
    "input": 0, "lower": 1, "float32": 2, "promote": 3, "raises": 4, "error": -1, "absent": -2,
    "not compiled": -3,  # the compiled atlas (scenarios/test_compiled_atlas.py): a graph break
}  # fmt: skip
BEHAVIOURS = {code: name for name, code in CODES.items()}
DEVICES = ("cuda", "cpu")


@dataclass(frozen=True)
class Documented:
    release: str  # the release whose documentation is used: "2.13"
    lists: dict[str, str]  # op name as the docs spell it -> "lower" | "float32" | "promote"
    banned: tuple[str, ...]  # ops documented to raise inside an autocast region
    note: str  # "" or why another release's documentation stands in for this one's

    def of(self, name: str) -> str | None:
        return self.lists.get(name)


@functools.cache
def _data() -> dict:
    with LISTS_PATH.open("rb") as f:
        return tomllib.load(f)


def releases_read() -> list[tuple[int, int]]:
    return [release_of(r) for r in _data()["releases_read"]]


def sources() -> list[dict]:
    """The documentation read, per release: repository, path and commit."""
    return list(_data()["source"])


def documented(device: str, version: str) -> Documented:
    """The documented lists of `device` ("cuda" or "cpu") for the torch `version` in use."""
    read = releases_read()
    asked = release_of(version)
    # Every minor release from the first read to the last is read: outside them, the nearest.
    release = min(max(asked, read[0]), read[-1])
    note = ""
    if release != asked:
        note = (
            f"torch {release_text(asked)} is held to the lists of {release_text(release)}, the "
            f"nearest release whose documentation was read ({release_text(read[0])} to "
            f"{release_text(read[-1])})"
        )
    lists: dict[str, str] = {}
    data = _data()[device]
    for name in LISTS:
        table = data[name]
        for op in table["ops"]:
            lists[op] = name
        for change in table.get("changed", []):
            since = release_of(change["since"])
            until = release_of(change["until"]) if "until" in change else None
            if since <= release and (until is None or release < until):
                lists[change["op"]] = name
    banned = tuple(data.get("banned", {}).get("ops", ()))
    return Documented(release_text(release), lists, banned, note)


def every_documented_op() -> list[str]:
    """Every op any release's lists name, on any device: the atlas calls each on every device."""
    data = _data()
    names = []
    for device in DEVICES:
        for name in LISTS:
            names += data[device][name]["ops"]
            names += [c["op"] for c in data[device][name].get("changed", [])]
        names += data[device].get("banned", {}).get("ops", [])
    return list(dict.fromkeys(names))


# The aten op each call reaches where its name differs from the op's own: the docs spell one op
# several ways across devices (`cross_entropy` on CUDA, `cross_entropy_loss` on the CPU), and an
# op's own autocast rule is registered under its aten name.
ATEN = {
    "__matmul__": "matmul",
    "multi_dot": "linalg_multi_dot",
    "GRUCell": "gru_cell",
    "LSTMCell": "lstm_cell",
    "RNNCell": "rnn_tanh_cell",
    "grid_sample": "grid_sampler",
    "cross_entropy": "cross_entropy_loss",
    "softmin": "softmax",
    "__pow__": "pow",
    "__rpow__": "pow",
    "__rdiv__": "reciprocal",
    "__rtruediv__": "reciprocal",
    "normalize": "norm",
    "interpolate": "upsample_bilinear2d",
}


def aten(name: str) -> str:
    return ATEN.get(name, name)


def listed(name: str, documented: Documented, device: str) -> str:
    """The list the docs put `name` on, under any spelling of its aten op ("raises" for an op
    documented to raise inside autocast on CUDA; NO_LIST for none)."""
    if device == "cuda" and name in documented.banned:
        return "raises"
    by_aten = {aten(op): where for op, where in documented.lists.items()}
    return documented.of(name) or by_aten.get(aten(name)) or NO_LIST
