"""The settings a user chose on the command line (``--tiny``, ``--param``, ``--params``, flags), checked."""

from __future__ import annotations

import json

from mygpt.errors import UserError


def parse_param(text: str) -> tuple[str, object]:
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise UserError(f"--param {text!r} is not KEY=VALUE (e.g. --param steps=100)")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return key.strip(), value


def chosen_groups(args) -> dict[str, dict]:
    """The settings the user chose, per stage (the stages' defaults fill in the rest): --tiny, --params,
    --param and the flags, later ones winning."""
    from flows.settings import TINY, Pipeline

    groups: dict[str, dict] = {}

    def add(flat: dict) -> None:
        for group, values in Pipeline.group_flat(flat).items():
            groups.setdefault(group, {}).update(values)

    if args.tiny:
        add(TINY)
    if getattr(args, "params", None):
        try:
            extra = json.loads(args.params)
        except ValueError as e:
            raise UserError(f"--params is not a JSON object: {e}") from None
        if not isinstance(extra, dict):
            raise UserError(f"--params must be a JSON object, got {args.params!r}")
        add(extra)
    add(dict(parse_param(p) for p in args.param))
    flags = {flag: getattr(args, flag, None) for flag in ("artifacts_dir", "source_url", "only", "force")}
    add({k: v for k, v in flags.items() if v})
    if getattr(args, "full_check", False):
        add({"full_check": True})
    return groups


def checked(args):
    """The chosen settings, checked (fast, before Prefect starts): a ``flows.settings.Pipeline``."""
    from flows.settings import Pipeline

    return Pipeline.parse(**chosen_groups(args))
