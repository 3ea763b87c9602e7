"""Text from catalogues, evidence, baselines and the journal, shown as data wherever it is shown:
never as rich markup (`[/bold]` crashed `list`, `[lo, hi]` vanished, `[link=...]` made a
clickable link), never as terminal control (an ESC in evidence cleared the screen or set the
window title under `pytest -v`), never as live Markdown (`[x](javascript:...)` and raw HTML in
summary.md and the `baseline changes` page), and in whatever encoding the terminal has (an ASCII
terminal ended `list` in a UnicodeEncodeError)."""

from __future__ import annotations

import io
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.text import Text

# Control characters but the new line and the tab: C0 (ESC starts colour, clear-screen, title and
# link sequences; BEL, backspace and CR overwrite what was printed), DEL and C1; and the invisible
# ones that reorder or hide text (zero-width, bidirectional overrides and isolates, BOM).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
# What makes a link, an image, code or a cell break in Markdown; `<` (raw HTML, autolinks) and
# `&` (entities) are written as entities instead. `>` starts nothing inside a line.
_MARKDOWN = re.compile(r"([\\`\[\]|])")


def visible(text: str) -> str:
    """`text` for a terminal: each control character written out (`\\x1b`, `\\r`, `\\u202e`)."""
    return _CONTROL.sub(lambda found: found[0].encode("unicode_escape").decode("ascii"), text)


def text(value, style: str = "") -> Text:
    """A rich Text of `value`, visible(): rich never reads it as markup."""
    from rich.text import Text  # rich is imported by the commands that print with it

    return Text(visible(str(value)), style=style)


def markdown(value) -> str:
    """`value` in a Markdown table cell or list item: one line, & and < as entities, and
    \\ ` [ ] | escaped with a backslash, so it reads as written and links nowhere."""
    one_line = " ".join(str(value).split()).replace("&", "&amp;").replace("<", "&lt;")
    return _MARKDOWN.sub(r"\\\1", one_line)


def for_encoding(value: str, encoding: str | None) -> str:
    """`value` as a stream of `encoding` takes it: what it cannot encode written as `\\u4e2d`.
    (pytest's terminal writer, given text its stream cannot encode, escapes all of it, new lines
    included: the verdict table came out as one line.)"""
    encoding = encoding or "utf-8"
    return value.encode(encoding, "backslashreplace").decode(encoding)


class Buffer(io.StringIO):
    """A StringIO that says which encoding its text is for: rich draws ASCII boxes for one that
    is not UTF-8 (it reads `file.encoding`)."""

    def __init__(self, encoding: str | None):
        super().__init__()
        self._encoding = encoding or "utf-8"

    @property
    def encoding(self) -> str:
        return self._encoding

    def getvalue(self) -> str:
        return for_encoding(super().getvalue(), self._encoding)


# What UTF-8 cannot encode: a lone surrogate. os.fsdecode and sys.argv turn each byte of a file
# name that is not UTF-8 into one (b"caf\xe9" -> "caf\udce9", surrogateescape), and any
# Latin-1 path gives such text.
_SURROGATE = re.compile("[\ud800-\udfff]")


def storable(value):
    """`value` (text, or a list or dict holding text, at any depth) with what UTF-8 cannot
    encode escaped, so that the journal, MLflow and a terminal take it: a byte os.fsdecode kept
    as a surrogate reads as `\\xe9` (the byte), any other lone surrogate as `\\udXXX`.
    Escaped, never dropped: the reader still sees which byte it was. Other values as they are."""
    if isinstance(value, str):
        return value if value.isascii() else _SURROGATE.sub(_escape, value)
    if isinstance(value, list):
        return [storable(item) for item in value]
    if isinstance(value, dict):
        return {storable(key): storable(item) for key, item in value.items()}
    return value


def _escape(found: re.Match) -> str:
    code = ord(found[0])
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"
