"""Replace a file atomically: write a temporary file beside it, then rename."""
from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Callable


def replace_file(path: str, write: Callable[[str], None]) -> None:
    """`write(temporary_path)` fills a temporary file beside `path` (same suffix), which
    then replaces `path`; on any failure the temporary file is removed."""
    target = os.path.realpath(path)
    suffix = os.path.splitext(target)[1] or ".tmp"
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(target),
                                     prefix=f".{os.path.basename(target)}.", suffix=suffix)
    os.close(fd)
    try:
        write(temporary)
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
