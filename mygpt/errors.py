"""The one exception type for problems a user can fix.

A ``UserError`` message names the input that is wrong, what is wrong with it, and what to do.
CLIs turn it into ``error: <message>`` on stderr and exit code 2, without a traceback.
It subclasses ``ValueError`` so library callers can catch it as the usual bad-value error.
"""


from typing import Iterable


class UserError(ValueError):
    """Bad input that the user can fix; the message says which input and how."""


def describe_chars(chars: Iterable[str], limit: int = 20) -> str:
    """``'Z' (U+005A), '€' (U+20AC)`` for error messages about characters (at most ``limit`` shown)."""
    chars = list(chars)
    shown = ", ".join(f"{c!r} (U+{ord(c):04X})" for c in chars[:limit])
    if len(chars) > limit:
        shown += f", ... ({len(chars) - limit} more)"
    return shown
