"""Children that end with the process that started them: a SIGKILLed ``cutline broker`` leaves no
broker running.

A broker process runs in a session of its own (a Ctrl-C in the terminal reaches the command, which
stops it in order), so nothing else ends it when its parent dies without cleaning up: SIGKILL, the
OOM killer. On Linux the kernel can: ``prctl(PR_SET_PDEATHSIG)`` in the child between fork and exec.
Neither the standard library nor a well-kept package offers that call (``python-prctl`` needs a C
build), so it is made here through ``ctypes``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
"""From ``<linux/prctl.h>``."""


def ends_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen` that has the kernel send the child ``sig`` when
    its parent dies; None where the platform has no such call (the child then outlives a killed parent).

    Linux sends it when the *thread* that started the child ends: start such children from a thread
    that lives as long as they should (the command line's main thread)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def tie_to_parent() -> None:
        libc.prctl(PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:  # the parent died before the call: no signal would come
            os.kill(os.getpid(), sig)

    return tie_to_parent
