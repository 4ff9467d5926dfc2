"""``UserError``, the one exception for problems a user can fix (CLIs print ``error: <message>``, exit 2), and
the one integer check."""

from __future__ import annotations

import numbers
from collections.abc import Iterable


class UserError(ValueError):
    """Bad input that the user can fix; the message says which input and how."""


def check_int(name: str, value: object, minimum: int | None = None, hint: str = "") -> int:
    """``value`` as an ``int`` if it is a whole number (not a bool) ``>= minimum``; else ``UserError``
    (``<name> must be an integer >= <minimum>, got <value>; <hint>``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or (minimum is not None and value < minimum):
        bound = f" >= {minimum}" if minimum is not None else ""
        raise UserError(f"{name} must be an integer{bound}, got {value!r}" + (f"; {hint}" if hint else ""))
    return int(value)


def describe_chars(chars: Iterable[str], limit: int = 20) -> str:
    """``'Z' (U+005A), '€' (U+20AC)`` for error messages about characters (at most ``limit`` shown)."""
    chars = list(chars)
    shown = ", ".join(f"{c!r} (U+{ord(c):04X})" for c in chars[:limit])
    if len(chars) > limit:
        shown += f", ... ({len(chars) - limit} more)"
    return shown
