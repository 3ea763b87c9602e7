"""How long one file name may be where the harness writes one (`new`'s scenario file,
`report --name`'s folder): checked before writing, since open() and mkdir() past the limit raise
"File name too long" with the whole name in the message, after other work is done."""

from __future__ import annotations

import os
from pathlib import Path


def name_max(folder: Path) -> int:
    """The longest file name the file system of `folder` (or of its nearest existing parent)
    takes: 255 bytes on ext4, APFS and NTFS, also where the platform does not say."""
    folder = Path(folder).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):  # a platform or file system that does not say
        return 255
