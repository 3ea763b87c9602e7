"""`amp-harness new NAME`: scenarios/test_NAME.py written from templates/scenario.py.tmpl, a real
scenario that passes as written and keeps the contract `amp-harness validate` checks
(contract.py), with a claim of its own added to the project catalogue."""

from __future__ import annotations

import re
import string
import textwrap
from pathlib import Path

from harness.catalogue.claims import Claim, add_project_claim
from harness.catalogue.scenario_source import scenario_folder
from harness.common import filenames, shown
from harness.common.errors import HarnessError

TEMPLATE_PATH = Path(__file__).parent / "templates" / "scenario.py.tmpl"
_NAME = re.compile(r"[A-Za-z0-9_]+")


def new_scenario(
    name: str,
    folder: Path,
    catalogue_path: Path,
    claim_id: str | None = None,
    statement: str | None = None,
    source: str = "team decision",
    expected: str | None = None,
) -> tuple[Path, Claim]:
    """Write folder/test_NAME.py from the template, checking a claim of its own that is added to
    the project catalogue at `catalogue_path`: `claim_id` and `statement`, or else an ID made from
    NAME with the template's example statement (never an existing claim: its verdicts would
    join that claim's), with the verdict the team `expected`, if given. Never overwrites;
    writes nothing when anything is wrong."""
    if not _NAME.fullmatch(name) or name.startswith("test_"):
        suggestion = re.sub(r"\W+", "_", name.removeprefix("test_"), flags=re.ASCII).strip("_")
        raise HarnessError(
            f"scenario name {name!r}: use letters, digits and underscores only, without the test_ "
            f"prefix (the file is test_NAME.py, a Python module name); e.g. "
            f"`amp-harness new {suggestion.lower() or 'my_claim'}`"
        )
    folder = scenario_folder(folder)
    name_max = filenames.name_max(folder)
    longest = name_max - len("test_.py")
    if len(name) > longest:
        raise HarnessError(
            f"scenario name of {len(name)} characters is too long: test_NAME.py must fit the "
            f"{name_max}-character file names of {folder}, so NAME takes at most {longest}; "
            f"pick a shorter one, e.g. `amp-harness new {name[:40].rstrip('_') or 'my_claim'}`"
        )
    path = folder / f"test_{name}.py"
    if path.exists():
        raise HarnessError(
            f"{path} exists: pick another NAME, or delete the file first if you mean to start over"
        )
    if claim_id is None:
        claim_id = "PROJECT-" + (re.sub(r"[^A-Z0-9]+", "-", name.upper()).strip("-") or "X")
        statement, source = TEMPLATE_STATEMENT, TEMPLATE_SOURCE
    before = catalogue_path.read_bytes() if catalogue_path.exists() else None
    # A statement typed in a Latin-1 terminal reaches sys.argv as surrogates: escaped, so the
    # catalogue (UTF-8 TOML) takes it.
    statement, source = shown.storable(statement), shown.storable(source)
    claim = add_project_claim(catalogue_path, claim_id, statement, source, expected)
    text = string.Template(TEMPLATE_PATH.read_text(encoding="utf-8")).substitute(
        name=name, claim=claim.id, statement=_comment(f"{claim.id}: {claim.statement}")
    )
    try:
        with path.open("x", encoding="utf-8") as f:  # "x": fails if the file exists
            f.write(text)
    except OSError as exc:  # a read-only folder, a full disk: the reason, never a traceback
        # The claim goes with its scenario: the catalogue is put back as it was.
        if before is None:
            catalogue_path.unlink(missing_ok=True)
        else:
            catalogue_path.write_bytes(before)
        raise HarnessError(
            f"cannot write {path}: {exc.strerror}; make {folder} writable or pass --scenarios DIR"
        ) from None
    return path, claim


TEMPLATE_STATEMENT = (
    "After .half() a parameter and its gradient take 2 bytes each; under fp16 autocast they stay "
    "float32, 4 bytes each: autocast alone does not halve the memory of parameters."
)
TEMPLATE_SOURCE = "amp-harness new: the template's example claim (replace it with yours)"


def _comment(text: str) -> str:
    """`text` as the lines of a Python comment that fit the line length (any character is safe
    in a comment; a line break is not)."""
    return "\n".join(f"# {line}" for line in textwrap.wrap(" ".join(text.split()), 96))
