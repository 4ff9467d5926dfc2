"""What ``wiki-pipeline run`` prints of an error the user can fix: the ``error:`` line alone (flows/cli.py), not
Prefect's tracebacks of it. While :func:`user_errors_told_once` holds, the console's handlers drop Prefect's
records of a :class:`~mygpt.errors.UserError` (a traceback, then the failed states that repeat its message); the
server's log handler keeps them all, so the UI still shows where it was raised. Any other exception is printed
as Prefect prints it."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from mygpt.errors import UserError

#: How much of a user error's message marks a later record as repeating it (Prefect may shorten a state message).
_MARK_CHARS = 80


class UserErrorRecords(logging.Filter):
    """Drops a record that carries a ``UserError``, and a later ``prefect`` record that repeats its message."""

    def __init__(self) -> None:
        super().__init__()
        self.marks: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, UserError):
            self.marks.add(str(exc)[:_MARK_CHARS])
            return False
        if self.marks and record.name.startswith("prefect"):
            message = record.getMessage()
            return not any(mark in message for mark in self.marks)
        return True


@contextlib.contextmanager
def user_errors_told_once() -> Iterator[None]:
    """The console handlers of the root logger (Prefect's console handler) filtered by :class:`UserErrorRecords`."""
    handlers = [h for h in logging.getLogger().handlers if isinstance(h, logging.StreamHandler)]
    records = UserErrorRecords()
    for handler in handlers:
        handler.addFilter(records)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(records)
