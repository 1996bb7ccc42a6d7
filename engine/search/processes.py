"""Child processes of a search: dying with the parent that started them."""

from __future__ import annotations

import ctypes
import signal
import sys

__all__ = ["die_with_parent"]


def die_with_parent() -> None:
    """Ask the kernel to kill this process when its parent dies (Linux: PR_SET_PDEATHSIG; a
    fork does not inherit it, so every child asks for itself). Elsewhere nothing happens: the
    caller checks its parent instead."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
        except OSError:
            pass
