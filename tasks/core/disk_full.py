"""A full disk (``ENOSPC``, or a quota's ``EDQUOT``) while a stage runs, as a ``UserError`` that names the stage,
where it was writing and the space left there: one ``error:`` line (exit 2) instead of ``OSError: [Errno 28] No
space left on device``. Why a user error: freeing space (``wiki-pipeline gc``) or another root fixes it, and a
rerun resumes (the store publishes whole versions only)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator

from mygpt.errors import UserError
from tasks.core.report import human_bytes

#: The errors a full disk or a full quota raise.
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def _space(path: str) -> str:
    """``"a filesystem of 8.0 MB, 1.2 MB free now"`` for the one holding ``path`` (its nearest existing folder), or
    ``""``; "now": after the failed write was taken back."""
    where = os.path.abspath(path)
    while not os.path.exists(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    try:
        usage = shutil.disk_usage(where)
    except OSError:
        return ""
    return f"a filesystem of {human_bytes(usage.total)}, {human_bytes(usage.free)} free now"


@contextlib.contextmanager
def disk_full_named(stage: str, root: str) -> Iterator[None]:
    """Re-raise a no-space ``OSError`` in its block as ``UserError`` naming ``stage``, the file being written (else
    the artifact root ``root``) and the space left on its filesystem; any other error goes on as it is."""
    try:
        yield
    except OSError as e:
        if e.errno not in NO_SPACE:
            raise
        where = os.fspath(e.filename) if e.filename else root
        space = _space(where) if "://" not in where else ""
        raise UserError(
            f"{stage}: no space left on the device writing {where}" + (f" ({space})" if space else "") + "; free "
            "some space (`wiki-pipeline gc --yes` deletes what no run needs) or give another --artifacts-dir, then "
            "rerun: finished stages are reused, nothing half-written was published"
        ) from e
