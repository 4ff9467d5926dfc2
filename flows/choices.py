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
    --param and the flags; one setting given two values is refused (the preset gives way to what the user
    gives). With ``only`` the preset gives the stage that runs and ``run``
    only (:func:`preset_for`)."""
    from flows.settings import TINY, Pipeline

    groups: dict[str, dict] = {}

    def add(flat: dict) -> None:
        for group, values in Pipeline.group_flat(flat).items():
            for field, value in values.items():
                before = groups.get(group, {}).get(field, value)
                if before != value and before == before:  # used or refused, never dropped (NaN is no second value)
                    raise UserError(
                        f"{group}.{field} is given twice: {_shown(before)} and {_shown(value)} by --param/--params; "
                        "give it once"
                    )
            groups.setdefault(group, {}).update(values)

    if getattr(args, "params", None):
        try:
            extra = json.loads(args.params)
        except ValueError as e:
            raise UserError(f"--params is not a JSON object: {e}") from None
        if not isinstance(extra, dict):
            raise UserError(f"--params must be a JSON object, got {args.params!r}")
        add(extra)
    for param in args.param:
        add(dict([parse_param(param)]))
    flags = {flag: getattr(args, flag, None) for flag in ("artifacts_dir", "source_url", "only", "force")}
    flagged = Pipeline.group_flat({k: v for k, v in flags.items() if v})
    _refuse_overruled(groups, flagged)
    for group, values in flagged.items():
        groups.setdefault(group, {}).update(values)
    if getattr(args, "full_check", False):
        add({"full_check": True})
    if not args.tiny:
        return groups
    preset = preset_for(TINY, groups.get("run", {}).get("only"))
    return {name: {**preset.get(name, {}), **groups.get(name, {})} for name in {**preset, **groups}}


def _refuse_overruled(given: dict[str, dict], flagged: dict[str, dict]) -> None:
    """``UserError`` when a flag (``--source-url``, ``--artifacts-dir``, ...) sets a field that ``--param`` or
    ``--params`` set to another value. Why refuse: the flag would win and the other value be dropped without a
    word (``scripts/pipeline --demo`` passes ``--source-url`` for its mirror, so ``--demo --param
    corpus.source_url=...`` trained on the demo text); a setting the user gave is used or refused, never dropped."""
    for group, values in flagged.items():
        for field, value in values.items():
            other = given.get(group, {}).get(field, value)
            if other != value:
                flag = "--" + field.replace("_", "-")
                raise UserError(
                    f"{group}.{field} is given twice: {_shown(other)} by --param/--params and {_shown(value)} by "
                    f"{flag}"
                    + (
                        " (scripts/pipeline --demo passes --source-url for its loopback mirror: run without --demo "
                        "to use your own source)"
                        if field == "source_url"
                        else ""
                    )
                    + "; give it once"
                )


def _shown(value: object) -> str:
    from tasks.core.urls import redact_url

    return repr(redact_url(value)) if isinstance(value, str) else repr(value)


def preset_for(preset: dict[str, dict], only: object) -> dict[str, dict]:
    """The part of ``preset`` a run applies: all of it, or with ``only`` the running stage's group and ``run``.
    Why: ``only=`` asks every field given by name of the upstream versions it takes, and a preset's value is not
    one the user asked for (``--tiny --only samples`` would refuse, or pass over, the newest model for having
    trained other than the preset's ``model.steps``); the stage that runs does take the preset's settings."""
    from tasks.registry import stage_name

    if not only:
        return preset
    try:
        running = stage_name(only, "only")
    except UserError:  # the settings' own check reports it, with the rest
        return preset
    return {name: values for name, values in preset.items() if name in (running, "run")}


def checked(args):
    """The chosen settings, checked (fast, before Prefect starts): a ``flows.settings.Pipeline``."""
    from flows.settings import Pipeline

    return Pipeline.parse(**chosen_groups(args))
