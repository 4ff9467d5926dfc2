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
    ``stale`` (see :meth:`ArtifactStore.stale_versions`) are marked, with why."""
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
        inputs = ", ".join(f"{k}/{i['version']}" for k, i in sorted((v.manifest.get("inputs") or {}).items()))
        why = stale.get((v.stage, v.version))
        lines.append(
            f"{v.stage:10s} {v.version:12s} {v.manifest.get('created_at', ''):20s} "
            f"{human_bytes(v.size_bytes):>9s}  {inputs or '-'}" + (f"  [stale: {why}]" if why else "")
        )
    return "\n".join(lines)


def cmd_artifacts(args) -> int:
    from tasks.core.report import human_bytes
    from tasks.registry import code_versions, open_store, stage_name

    store = open_store(args.artifacts_dir)
    stage = stage_name(args.stage, "--stage") if args.stage else None
    everything = store.versions()  # read once: the listing and the stale verdicts (which need every version)
    stale = store.stale_versions(code_versions(), everything)
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
                    }
                    for v in rows
                ],
                indent=1,
            )
        )
        return 0
    print(format_listing(store, rows, stale))
    leftovers = [g for g in store.garbage() if not g.local]  # this machine's cached copies are no leftovers
    if leftovers or stale:
        size = sum(g.bytes for g in leftovers)
        print(
            f"\n{len(stale)} stale version(s) (no run reuses them); {len(leftovers)} unfinished build or leftover "
            f"dir(s) holding {human_bytes(size)}: `wiki-pipeline gc` lists them (--stale for the stale versions)"
        )
    return 0


def cmd_gc(args) -> int:
    """List what no run needs -- how big, why -- and with ``--yes`` delete it, never what a running build locks."""
    from tasks.core.report import human_bytes
    from tasks.registry import code_versions, open_store

    store = open_store(args.artifacts_dir)
    items = store.garbage(code_versions() if args.stale else None)
    if not items:
        print(f"nothing to collect under {store.root}")
        return 0
    print(f"{'deleting' if args.yes else 'would delete (dry run; --yes deletes)'} under {store.root}:")
    freed = kept = 0
    for item in items:
        where = f"(cache) {item.key}" if item.local else item.key
        in_use = item.in_use or (args.yes and not store.collect(item))
        if in_use:
            kept += 1
            print(f"  {'in use':>9s}  {where}  kept: a running build is writing or reading it")
            continue
        freed += item.bytes
        print(f"  {human_bytes(item.bytes):>9s}  {where}  {item.reason}")
    verb = "freed" if args.yes else "would free"
    print(f"{verb} {human_bytes(freed)} in {len(items) - kept} item(s)" + (f"; {kept} in use, kept" if kept else ""))
    return 0


def cmd_pull(args) -> int:
    """Copy one published version into a local directory (for ``from_pretrained``, DuckDB, or a look by hand)."""
    from pathlib import Path

    from tasks.core.report import human_bytes
    from tasks.registry import open_store

    stage, _, version = args.version.strip().strip("/").partition("/")
    store = open_store(args.artifacts_dir)
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
    print(
        f"copied {stage}/{version} ({human_bytes(info.size_bytes)}, every file checked) from {info.path} to {args.dest}"
    )
    return 0
