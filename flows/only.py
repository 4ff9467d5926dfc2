"""``only=``'s inputs: the latest current upstream versions whose whole lineage has what the run asks of them
(:func:`latest_upstream`, :func:`asked_of_upstream`), and the refusal that names the stage to rebuild and a command
that works when none has."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from flows.settings import LINKED, SHARED_FLAT, PipelineBase
from mygpt.errors import UserError
from tasks.core.stage import StageRef, stage_logger
from tasks.registry import BY_NAME, NAMES, code_versions
from tasks.store import ArtifactStore, VersionInfo


@dataclass(frozen=True)
class Asked:
    """A setting this run asks of an upstream version that it was not built with (``str``: ``field=want (it has
    have)``); ``param``: a ``--param`` can ask for it (a pretrained source's sha256 cannot)."""

    field: str
    want: object
    have: object
    param: bool = True

    def __str__(self) -> str:
        if not self.param:
            return f"{self.field} of {self.want} (it has {self.have})"
        return f"{self.field}={self.want!r} (it has {self.have!r})"

    def as_param(self) -> str:
        value = self.want if isinstance(self.want, str) else json.dumps(self.want)
        return "--param " + shlex.quote(f"{self.field}={value}")


#: ``(stage, a version's manifest) -> what this run asks of that stage that the version was not built with``
#: (``[Asked("tokenizer.kind", "byte", "chapter")]``); empty: it will do.
Differs = Callable[[str, dict], list[Asked]]


def asked_of_upstream(s: PipelineBase, store: ArtifactStore | None = None) -> Differs:
    """What ``only=`` compares an upstream version with: the fields this run gives by name for that stage (any
    upstream stage: ``--only model -p shards.shard_tokens=1000`` asks for shards of 1000 tokens), and those the
    linked groups imply (``corpus.article_index`` for a byte-level tokenizer). Why: ``only=`` runs on the latest
    versions whatever the other groups' defaults say, but a field given by name is asked for, and a run that
    silently took a version built otherwise would log settings it did not use. A shared flat name (``seed``,
    ``device``, ``precision``: :data:`SHARED_FLAT`) given to the stage that runs with the same value is for it
    (``--only samples -p seed=7``), not asked of its inputs. A pretrained tokenizer's ``source`` given by name asks
    for a version of that file's content (its sha256, read once: ``Stage.source``, which with ``store`` falls
    back offline as the stage does)."""
    identities: dict[str, dict | None] = {}
    running = getattr(s, s.run.only) if s.run.only else None

    def for_the_running_stage(key: str, value: object) -> bool:
        return (
            running is not None
            and key in SHARED_FLAT
            and key in running.model_fields_set
            and getattr(running, key) == value
        )

    def differs(name: str, manifest: dict) -> list[Asked]:
        built = manifest.get("settings", {})
        given, resolved = getattr(s, name), s.resolved(name)
        out: list[Asked] = []
        if getattr(resolved, "kind", None) == "pretrained" and "source" in given.model_fields_set:
            source = BY_NAME[name].source
            if name not in identities:
                identities[name] = source(resolved, store, stage_logger(name)) if source else None
            want, have = identities[name] or {}, manifest.get("source") or {}
            if want.get("sha256") != have.get("sha256"):
                out.append(Asked(f"{name}.source", f"sha256 {want.get('sha256')}", have.get("sha256"), param=False))
        wanted = resolved.version_params()
        keys = {k for k in given.model_fields_set if not for_the_running_stage(k, getattr(given, k))}
        if name in LINKED:  # what another group's settings imply for this one counts as asked for
            alone = given.resolved_once()
            keys |= {k for k in wanted if getattr(alone, k) != getattr(resolved, k)}
        fields = type(resolved).model_fields
        for key in sorted(keys & set(wanted)):
            have = built.get(key, fields[key].default)
            if have != wanted[key]:
                out.append(Asked(f"{name}.{key}", wanted[key], have))
        return out

    return differs


def latest_upstream(store: ArtifactStore, stage: str, differs: Differs | None = None) -> dict[str, StageRef]:
    """The inputs of ``stage``: the nearest upstream stage's latest current (not stale) version whose whole
    ancestry has what this run asks of it (``differs``, :func:`asked_of_upstream`: that version's own settings and
    those of every version it was built from, transitively, as the manifests record them), and the versions it was
    built from for the others (so tokenizer and shards always match). Why the whole ancestry: samples built from a
    model whose tokenizer had other merges than asked would be reused while the header logs what was asked.
    ``UserError`` when every version of an input is stale (what ``only=`` built on it would be stale at once), or
    none has the settings asked for: it names the furthest upstream stage to rebuild and a command that works."""
    needed = BY_NAME[stage].inputs
    refs: dict[str, StageRef] = {}
    stale = store.stale_versions(code_versions()) if needed else {}
    differs = differs or (lambda name, manifest: [])
    for name in sorted(needed, key=NAMES.index, reverse=True):
        if name in refs:
            continue
        versions = store.versions(name)
        if not versions:
            raise UserError(
                f"only={stage!r} needs a published {name} version under {store.root}, and there is "
                "none; run the whole pipeline once first"
            )
        current = [v for v in versions if (name, v.version) not in stale]
        if not current:
            latest = versions[-1]
            raise UserError(
                f"only={stage!r} needs a current {name} version under {store.root}, and every published one is "
                f"stale (the latest, {name}/{latest.version}: {stale[(name, latest.version)]}); run "
                f"only={name!r} first (or the whole pipeline) to build one from the current upstream versions"
            )
        for info in reversed(current):  # the latest whose lineage has what the run asks for
            chosen = _lineage(store, info, needed, refs, strict=info is current[-1])
            if chosen is not None and not [a for n, v in chosen.items() for a in differs(n, v.manifest)]:
                break
        else:
            chosen = _lineage(store, current[-1], needed, refs, strict=True) or {}
            asked = [a for n, v in chosen.items() for a in differs(n, v.manifest)]
            raise UserError(_refusal(store, stage, name, current, asked, differs))
        assert chosen is not None  # the loop ends with a break only on a lineage that fits
        for info in chosen.values():
            refs.setdefault(
                info.stage,
                StageRef(
                    stage=info.stage, version=info.version, build_id=info.manifest["build_id"], path=str(info.path)
                ),
            )
    return {name: refs[name] for name in needed}


def _refusal(
    store: ArtifactStore, stage: str, name: str, current: list[VersionInfo], asked: list[Asked], differs: Differs
) -> str:
    """Why ``only=stage`` has no ``name`` version to take, and what to run: the furthest upstream stage of which no
    current version fits (its ancestry included) must be rebuilt, and everything after it; a whole run with the
    asked settings does that (it rebuilds what differs and reuses the rest). ``--only`` of that stage is offered as
    well only where it would itself be accepted, so the suggested command never leads to another refusal."""
    stale = store.stale_versions(code_versions())
    ancestry, todo = set(), [name]
    while todo:  # name and every stage it is built from
        ancestry.add(up := todo.pop())
        todo += BY_NAME[up].inputs
    nearest_asked = min(NAMES.index(a.field.split(".")[0]) for a in asked)
    stages = {up for up in ancestry if NAMES.index(up) >= nearest_asked}  # the asked stages and those in between

    def fits(up: str) -> bool:
        for info in store.versions(up):
            if (up, info.version) not in stale:
                found = _lineage(store, info, (), {}, strict=False)
                if found is not None and not [a for n, v in found.items() for a in differs(n, v.manifest)]:
                    return True
        return False

    furthest = next(up for up in sorted(stages, key=NAMES.index) if up == name or not fits(up))
    upstream_first = sorted((a for a in asked if a.param), key=lambda a: NAMES.index(a.field.split(".")[0]))
    params = [a.as_param() for a in upstream_first]
    command = " ".join(["wiki-pipeline run", *params, "..."])
    try:
        latest_upstream(store, furthest, differs)
        upto = [a.as_param() for a in upstream_first if NAMES.index(a.field.split(".")[0]) <= NAMES.index(furthest)]
        first = f", or rebuild {furthest} first: {' '.join(['wiki-pipeline run --only', furthest, *upto, '...'])}"
    except UserError:
        first = ""
    ordered = sorted(asked, key=lambda a: -NAMES.index(a.field.split(".")[0]))
    return (
        f"only={stage!r} needs a {name} version built with {', '.join(map(str, ordered))}, and none of the "
        f"{len(current)} current one(s) under {store.root} is (the latest: {name}/{current[-1].version}); the "
        f"furthest upstream stage to rebuild is {furthest}: run the pipeline with this run's settings: {command} "
        f"(a whole run rebuilds what differs and reuses the rest){first}, or leave those settings out to take "
        "the latest"
    )


def _lineage(
    store: ArtifactStore, info: VersionInfo, needed: tuple[str, ...], known: dict, strict: bool
) -> dict[str, VersionInfo] | None:
    """``{stage: VersionInfo}``: ``info`` and every version it was built from, transitively (not already
    ``known``), following manifests; a version no longer published: ``UserError`` when ``strict`` and it is one of
    ``needed``, else None (not ``strict``) or its branch ends there (``strict``, further up than ``needed``: the
    latest stays usable after its far ancestors are collected)."""
    found: dict[str, VersionInfo] = {}
    todo = [info]
    while todo:
        cur = todo.pop()
        found.setdefault(cur.stage, cur)
        for up_name, up in cur.manifest.get("inputs", {}).items():
            if up_name not in known and up_name not in found:
                try:
                    todo.append(store.get(up_name, up["version"]))
                except FileNotFoundError:
                    if not strict:
                        return None
                    if up_name not in needed:
                        continue
                    raise UserError(
                        f"{cur.stage}/{cur.version} was built from {up_name}/{up['version']}, "
                        "which is no longer published; rerun the whole pipeline"
                    ) from None
    return found
