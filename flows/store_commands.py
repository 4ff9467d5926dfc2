"""``wiki-pipeline artifacts``, ``gc`` and ``pull``: the artifact store, listed, collected and copied out."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from mygpt.errors import UserError

if TYPE_CHECKING:
    from tasks.store import ArtifactStore, VersionInfo


def format_listing(
    store: ArtifactStore, versions: list[VersionInfo] | None = None, stale: dict[tuple[str, str], str] | None = None
) -> str:
    """Published versions (all, or ``versions``): stage, version, creation time, size, and lineage; those in
    ``stale`` (see :meth:`ArtifactStore.stale_versions`) are marked, with why, and a damaged one (listed by
    ``versions(damaged=True)``) shows only why: none of its manifest's values is trusted."""
    from tasks.core.report import human_bytes

    versions = store.versions() if versions is None else versions
    stale = stale or {}
    if not versions:
        return f"no published versions under {store.root}"
    lines = [
        f"artifacts under {store.root}",
        f"{'stage':10s} {'version':12s} {'created (UTC)':20s} {'size':>9s}  inputs",
    ]
    for v in versions:
        if v.damage:
            lines.append(f"{v.stage:10s} {v.version:12s} {'?':20s} {'?':>9s}  ?  [damaged: {v.damage}]")
            continue
        inputs = ", ".join(f"{k}/{i['version']}" for k, i in sorted(v.manifest["inputs"].items()))
        why = stale.get((v.stage, v.version))
        lines.append(
            f"{v.stage:10s} {v.version:12s} {v.manifest['created_at']:20s} "
            f"{human_bytes(v.size_bytes):>9s}  {inputs or '-'}" + (f"  [stale: {why}]" if why else "")
        )
    return "\n".join(lines)


def open_existing(artifacts_dir) -> ArtifactStore:
    """The store of the root ``artifacts_dir`` (None: the default one); ``UserError`` when that directory does
    not exist, or that object-store prefix holds no object at all (an empty listing would read as "nothing
    published there", a typo's answer too). Only the commands that read a root ask this: a run makes its root."""
    from pathlib import Path

    from tasks.registry import open_store
    from tasks.store.s3 import ObjectFiles

    store = open_store(artifacts_dir)
    if isinstance(store.files, ObjectFiles) and store.files.is_empty():
        raise UserError(
            f"the artifact root {store.root} holds nothing (no object under that prefix); check its spelling, or "
            "give the root a run published into (--artifacts-dir, or WIKI_PIPELINE_ARTIFACTS)"
        )
    if not store.remote and not Path(store.root).is_dir():
        what = "is not a directory" if Path(store.root).exists() else "does not exist"
        raise UserError(
            f"the artifact root {store.root} {what}; give the directory a run published into "
            "(--artifacts-dir, or WIKI_PIPELINE_ARTIFACTS)"
        )
    return store


def cmd_artifacts(args) -> int:
    from tasks.core.report import human_bytes
    from tasks.registry import code_versions, stage_name

    store = open_existing(args.artifacts_dir)
    stage = stage_name(args.stage, "--stage") if args.stage else None
    everything = store.versions(damaged=True)  # read once: the listing and the stale verdicts (need every version)
    stale = store.stale_versions(code_versions(), [v for v in everything if not v.damage])
    rows = [v for v in everything if stage in (None, v.stage)]
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "stage": v.stage,
                        "version": v.version,
                        "path": str(v.path),
                        "bytes": v.size_bytes,
                        "build_id": v.manifest.get("build_id"),
                        "created_at": v.manifest.get("created_at"),
                        "inputs": {k: i["version"] for k, i in v.manifest.get("inputs", {}).items()},
                        "settings": v.manifest.get("settings"),
                        "stale": stale.get((v.stage, v.version)),
                        "damaged": v.damage or None,
                    }
                    for v in rows
                ],
                indent=1,
            )
        )
        return 0
    print(format_listing(store, rows, stale))
    garbage = [g for g in store.garbage() if not g.local]  # this machine's cached copies are no leftovers
    leftovers = [g for g in garbage if not g.published]
    damaged = len(garbage) - len(leftovers)
    if leftovers or stale or damaged:
        size = sum(g.bytes for g in leftovers)
        print(
            f"\n{len(stale)} stale version(s) (no run reuses them); {damaged} damaged version(s); "
            f"{len(leftovers)} unfinished build or leftover dir(s) holding {human_bytes(size)}: `wiki-pipeline gc` "
            "lists them (--stale for the stale versions)"
        )
    return 0


def _stale_kept(count: int) -> str:
    return (
        f"{count} stale version(s) kept (no run reuses them; `wiki-pipeline artifacts` marks them): "
        "`wiki-pipeline gc --stale` lists them, `--stale --yes` deletes them"
    )


def cmd_gc(args) -> int:
    """List what no run needs -- how big, why -- and with ``--yes`` delete it, never what a running build locks."""
    from tasks.core.report import human_bytes
    from tasks.registry import code_versions
    from tasks.store.files import printable

    store = open_existing(args.artifacts_dir)
    items = store.garbage(code_versions() if args.stale else None)
    stale = 0 if args.stale else len(store.stale_versions(code_versions()))  # kept: say so, and how to collect
    if not items:
        print(f"nothing to collect under {store.root}" + (f"; {_stale_kept(stale)}" if stale else ""))
        return 0
    print(f"{'deleting' if args.yes else 'would delete (dry run; --yes deletes)'} under {store.root}:")
    freed = kept = 0
    for item in items:
        where = printable(f"(cache) {item.key}" if item.local else item.key)  # a name from a listing
        in_use = item.in_use or (args.yes and not store.collect(item))
        if in_use:
            kept += 1
            print(f"  {'in use':>9s}  {where}  kept: a running build is writing or reading it")
            continue
        freed += item.bytes
        print(f"  {human_bytes(item.bytes):>9s}  {where}  {item.reason}")
    verb = "freed" if args.yes else "would free"
    print(f"{verb} {human_bytes(freed)} in {len(items) - kept} item(s)" + (f"; {kept} in use, kept" if kept else ""))
    if stale:
        print(_stale_kept(stale))
    return 0


def cmd_pull(args) -> int:
    """Copy one published version into a local directory (for ``from_pretrained``, DuckDB, or a look by hand)."""
    from pathlib import Path

    from tasks.core.report import human_bytes

    stage, _, version = args.version.strip().strip("/").partition("/")
    store = open_existing(args.artifacts_dir)
    try:
        info = store.pull(stage, version, Path(args.dest))
    except UserError:
        raise
    except ValueError as exc:
        raise UserError(
            f"pull {args.version}: {exc}; name a version as STAGE/VERSION (`wiki-pipeline artifacts`)"
        ) from None
    except FileNotFoundError as exc:
        raise UserError(f"pull {args.version}: {exc}; `wiki-pipeline artifacts` lists what is published") from None
    count = len(info.manifest["files"])
    print(
        f"copied {stage}/{version} ({count} file(s) its manifest lists, {human_bytes(info.size_bytes)}, each checked "
        f"against its sha256) from {info.path} to {args.dest}"
    )
    return 0
