"""A config field's help, bounds and user-facing name as dataclass field metadata.

``GPTConfig`` and ``TrainConfig`` declare their fields with :func:`option`; the CLI's flags and the pipeline's
settings are derived from :func:`options`, so each default, bound and description has one home.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any

from mygpt.errors import UserError, check_int

__all__ = ["Option", "check_options", "option", "options"]


@dataclass(frozen=True)
class Option:
    """One config field as users see it: ``name`` is how they type it (``--norm``, ``norm``) where that is not
    the ``field`` (``norm_type``); ``kind`` is ``int``, ``float``, ``bool`` or ``str``."""

    field: str
    name: str
    kind: type
    default: Any
    help: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    choices: tuple[str, ...] = ()


def option(
    default: Any, help: str, *, name: str | None = None, ge=None, gt=None, le=None, choices: tuple[str, ...] = ()
) -> Any:
    """A dataclass field with its :class:`Option` metadata. ``le`` is the field's sane upper bound, which the
    pipeline's settings enforce before a run starts: a float's far below an overflow (a finite ``lr=1e300`` passed
    every lower bound and overflowed inside a stage), an integer's far past any run meant (``steps=10**30``
    passed and trained until killed). The library itself takes any finite value and stops a run that diverges,
    naming the field."""
    meta = {"help": help, "name": name, "ge": ge, "gt": gt, "le": le, "choices": tuple(choices)}
    return dataclasses.field(default=default, metadata=meta)


def options(cls: type) -> dict[str, Option]:
    """The fields of ``cls`` declared with :func:`option`, by field name, in declaration order."""
    hints = typing.get_type_hints(cls)
    found = {}
    for f in dataclasses.fields(cls):
        if "help" not in f.metadata:
            continue
        m = f.metadata
        found[f.name] = Option(
            f.name,
            m["name"] or f.name,
            _kind(hints[f.name]),
            f.default,
            m["help"],
            m["ge"],
            m["gt"],
            m.get("le"),
            m["choices"],
        )
    return found


def _kind(hint: Any) -> type:
    """``int | None`` -> ``int``: the type a given value has."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
    return hint


def check_options(config: Any) -> None:
    """``UserError`` naming the first integer, boolean or choice field of ``config`` out of its bounds (floats
    are checked by their class, whose messages say more)."""
    for o in options(type(config)).values():
        value = getattr(config, o.field)
        if o.kind is bool and not isinstance(value, bool):
            raise UserError(f"{o.field} must be true or false, got {value!r}")
        if o.kind is int:
            check_int(o.field, value, None if o.ge is None else int(o.ge))
        if o.choices and value not in o.choices:
            raise UserError(f"{o.field} must be one of {', '.join(o.choices)}; got {value!r}")
