"""renameat2(2) through ctypes: RENAME_NOREPLACE (create, never replace) and RENAME_EXCHANGE (swap two folders)."""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys
from typing import Callable, Optional

AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_RENAMEAT2_SYSCALL = {"x86_64": 316, "aarch64": 276}
UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP}  # what a kernel or filesystem without it says


def _load_renameat2() -> Optional[Callable[..., int]]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    fn = getattr(libc, "renameat2", None)  # glibc 2.28+
    if fn is not None:
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        fn.restype = ctypes.c_int
        return fn
    number, syscall = _RENAMEAT2_SYSCALL.get(platform.machine()), getattr(libc, "syscall", None)
    if number is None or syscall is None:
        return None
    syscall.restype = ctypes.c_long
    return lambda a, b, c, d, flags: syscall(ctypes.c_long(number), ctypes.c_int(a), ctypes.c_char_p(b),
                                              ctypes.c_int(c), ctypes.c_char_p(d), ctypes.c_uint(flags))


_RENAMEAT2 = _load_renameat2()


def renameat2(src: str | os.PathLike, dst: str | os.PathLike, flags: int) -> None:
    """rename(2) with RENAME_NOREPLACE or RENAME_EXCHANGE; OSError EINVAL/ENOSYS where kernel or filesystem lack it."""
    if _RENAMEAT2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available here", str(src))
    if _RENAMEAT2(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(src), None, str(dst))
