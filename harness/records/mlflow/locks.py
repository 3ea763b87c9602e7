"""The file locks beside a store and its journal: one opening of a new embedded store at a time
(`_locked`), one `sync` at a time per journal (SYNC_LOCK), and a session's `Running` lock, held
for its life, which tells `sync` to leave a session that still runs alone (`is_running`)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

RUNNING_FOLDER = ".running"  # beside the journal: one lock file per session while it runs
SYNC_LOCK = ".sync.lock"  # beside the journal: one `sync` at a time


@contextlib.contextmanager
def _locked(path: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """An exclusive flock on `path` for the block (created if need be, with its folder: a new
    store's, which MLflow would make next). Where it cannot be created (a read-only folder), the
    lock is one in the temporary folder named after it, left there for the next one to take."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        digest = hashlib.sha256(str(path).encode()).hexdigest()[:16]
        fd = os.open(Path(tempfile.gettempdir()) / f"amp-harness-{digest}.lock",
                     os.O_RDWR | os.O_CREAT, 0o666)  # fmt: skip
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


# --- sessions that still run ---------------------------------------------------------------


def _running_path(folder: Path, session_id: str) -> Path:
    digest = hashlib.sha256(session_id.encode()).hexdigest()[:32]
    return Path(folder) / RUNNING_FOLDER / f"{digest}.lock"


class Running:
    """Says "this session still runs" to `amp-harness sync` until closed: a lock file beside the
    journal, held for the session's life. The kernel lets go of it when the process ends,
    however it ends (kill -9 included), so a lock nobody holds is a session that is over."""

    def __init__(self, folder: Path, session_id: str):
        self.path = _running_path(folder, session_id)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def close(self) -> None:
        if self._fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None


def is_running(folder: Path, session_id: str) -> bool:
    """Whether the session of this journal folder still runs (its Running lock is held). A lock
    file left by a session that died is taken away."""
    path = _running_path(folder, session_id)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        path.unlink(missing_ok=True)
        return False
    finally:
        os.close(fd)
