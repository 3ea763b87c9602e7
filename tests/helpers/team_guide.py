"""The files of docs/writing-a-scenario.md's team example ("Your own capability, recipe and
optimizer"), read from the guide itself: each fenced block whose first line is a comment naming
a file (`# scenarios/capabilities.py`) is that file, so the tests run what the guide shows."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO

GUIDE = REPO / "docs" / "writing-a-scenario.md"
_NAMED_BLOCK = re.compile(r"```(?:python|toml)\n# ((?:scenarios|tests)/[\w./]+)\n(.*?)```", re.S)


def guide_files() -> dict[str, str]:
    """{relative path: content} of every file the guide names."""
    files = {path: text for path, text in _NAMED_BLOCK.findall(GUIDE.read_text(encoding="utf-8"))}
    assert {"scenarios/claims.toml", "scenarios/capabilities.py", "scenarios/test_bf16_sgd.py",
            "tests/test_sensitivity_bf16_sgd.py"} <= set(files), sorted(files)  # fmt: skip
    return files


def write_guide_files(folder: Path, under: str = "") -> list[Path]:
    """Write the guide's files that start with `under` into `folder`; returns their paths."""
    written = []
    for relative, text in guide_files().items():
        if relative.startswith(under):
            path = folder / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written
