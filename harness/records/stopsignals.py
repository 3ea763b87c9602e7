"""SIGTERM and SIGHUP stop a session as Ctrl-C does.

`timeout`, a CI cancel and `docker stop` send SIGTERM; a closed terminal or a dropped ssh session
sends SIGHUP. Python's default for both is to die on the spot: pytest never ends its session, the
running test is recorded nowhere, and an isolated worker, in a process group of its own, runs on.
Raised as KeyboardInterrupt instead, they take Ctrl-C's way out: pytest stops, tears its fixtures
down and ends the session, the harness records the running test as interrupted (naming the
signal), and harness.records.isolation ends the worker and removes its folder.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable

SIGNALS = (signal.SIGTERM, signal.SIGHUP)
received = ""  # the name of the stop signal this process received, once it has


class Stopped(KeyboardInterrupt):
    """A stop signal, taken as Ctrl-C; its text is the signal's name ("SIGTERM")."""


def as_ctrl_c() -> Callable[[], None]:
    """Handle SIGTERM and SIGHUP as Ctrl-C in this process, where nothing else handles them
    (a handler of the user's, or of a tool around pytest, is left alone); returns the function
    that puts the previous handlers back. Signals reach only the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {
        s: signal.signal(s, _stop) for s in SIGNALS if signal.getsignal(s) == signal.SIG_DFL
    }

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    return restore


def _stop(signum: int, _frame) -> None:
    global received
    received = signal.Signals(signum).name
    # Once: a second signal while the session winds down (a runner that insists) ends the
    # process at once, as it would have without the harness.
    for s in SIGNALS:
        signal.signal(s, signal.SIG_DFL)
    raise Stopped(received)


def end_with_parent(parent: int, signum: int = signal.SIGTERM):
    """For Popen's preexec_fn: the child gets `signum` when the process `parent` (the one
    starting it) ends, however it ends: kill -9 included, which no handler sees. Linux's
    parent-death signal, kept across exec; None (nothing to arm) elsewhere."""
    if sys.platform != "linux":
        return None

    def arm() -> None:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signum)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), signum)

    return arm
