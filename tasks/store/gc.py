"""What no run needs under an artifact root (stale versions, unfinished builds, trash, orphan locks), and its
deletion under each version's lock."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from tasks.store.files import MANIFEST, Files, files_prefix
from tasks.store.layout import VERSION_RE
from tasks.store.posix import PosixFiles
from tasks.store.s3_cache import INCOMING
from tasks.store.versions import VersionInfo, Versions, content_digest

#: A stage's own finder of leftovers in its local folder: ``(path, bytes, why)`` for each.
Leftovers = Callable[[Path], Iterable[tuple[Path, int, str]]]


@dataclass(frozen=True)
class Garbage:
    """Something under an artifact root that no run needs."""

    key: str  # relative to the root (or, with ``local``, to the root's local cache)
    where: str  # the full path or URL, for messages
    stage: str
    version: str  # the version whose build lock guards it ("" for .trash entries and cached copies)
    bytes: int
    reason: str
    in_use: bool = False  # a run held its lock when it was listed
    published: bool = False  # a stale or damaged published version (not a staging or trash dir)
    local: bool = False  # in the local cache of an object-store root
    build_id: str = ""  # a published one's build when it was listed ("": damaged); collected only while unchanged


def _input_problem(name: str, ref: dict, manifests: dict, stale: dict) -> str | None:
    """Why the input ``name`` (``ref``: its lineage in a manifest) makes its user stale, or None."""
    key = (name, ref.get("version", ""))
    if key not in manifests:
        return f"its input {name}/{key[1]} is no longer published"
    if "digest" in ref:  # named by its content: rebuilt with the same bytes, it is the same input
        if content_digest(manifests[key]) != ref["digest"]:
            return f"its input {name}/{key[1]} was rebuilt with other bytes since"
    elif manifests[key].get("build_id") != ref.get("build_id"):  # recorded before inputs carried their digest
        return f"its input {name}/{key[1]} was rebuilt since"
    if key in stale:
        return f"its input {name}/{key[1]} is stale"
    return None


def stale_versions(listing: list[VersionInfo], code_versions: dict[str, str]) -> dict[tuple[str, str], str]:
    """``{(stage, version): why}`` for the versions of ``listing`` (a whole root's, in stage order) that no run
    reuses: built by another code version of their stage, or from an input rebuilt, deleted or stale itself."""
    manifests = {(v.stage, v.version): v.manifest for v in listing}
    stale: dict[tuple[str, str], str] = {}
    for v in listing:  # stage order: an input's verdict is known before its users'
        code = code_versions.get(v.stage)
        if code is not None and str(v.manifest.get("code_version")) != str(code):
            stale[(v.stage, v.version)] = (
                f"built by {v.stage} code version {v.manifest.get('code_version')}; "
                f"the code is at version {code}, so no run reuses it"
            )
            continue
        for name, ref in sorted((v.manifest.get("inputs") or {}).items()):
            why = _input_problem(name, ref, manifests, stale)
            if why:
                stale[(v.stage, v.version)] = f"{why}, so no run reuses it"
                break
    return stale


def find_garbage(
    store: Versions, leftovers: Mapping[str, Leftovers], code_versions: dict[str, str] | None
) -> list[Garbage]:
    """Staging areas, interrupted deletions in ``.trash``, lock files of nothing, what ``leftovers`` (per stage)
    find, with ``code_versions`` the stale versions; for an object-store root its local cache's too."""
    found: list[Garbage] = []
    cache = PosixFiles(store.files.local)
    places: list[tuple[Files, bool]] = [(store.files, False)] + ([(cache, True)] if store.remote else [])
    for files, local in places:
        for st in store._all_stages():
            found.extend(_garbage_of(store, files, st, local))
    if store.remote:  # downloads a killed process left (not those of the last 10 minutes: one may be running)
        for name in cache.subdirs(INCOMING):
            size, newest = cache.usage(f"{INCOMING}/{name}")
            if time.time() - newest > 600:
                why = "an interrupted download into this machine's cache"
                key = f"{INCOMING}/{name}"
                found.append(Garbage(key, cache.where(key), "", "", size, why, local=True))
    for st, finder in leftovers.items():
        for path, size, why in finder(store.stage_dir(st)):
            key = path.relative_to(store.files.local).as_posix()
            found.append(Garbage(key, str(path), st, "", size, why, local=store.remote))
    listing = store.versions(damaged=True)
    verdicts = {(v.stage, v.version): f"damaged: {v.damage}; no run reuses it" for v in listing if v.damage}
    if code_versions is not None:
        current = [v for v in listing if not v.damage]
        verdicts.update({k: f"stale: {why}" for k, why in stale_versions(current, code_versions).items()})
    for v in listing:
        verdict = verdicts.get((v.stage, v.version))
        if verdict is not None:
            key = store._version_key(v.stage, v.version)
            size, in_use = store.files.usage(key)[0], store.is_locked(v.stage, v.version)
            where, build = store.files.where(key), v.manifest.get("build_id", "")
            found.append(Garbage(key, where, v.stage, v.version, size, verdict, in_use, published=True, build_id=build))
    return found


def _garbage_of(store: Versions, files: Files, st: str, local: bool) -> Iterator[Garbage]:
    suffix = " (in this machine's cache)" if local else ""
    for name in files.subdirs(f"{st}/.staging"):
        if not VERSION_RE.fullmatch(name):
            continue  # not a version's staging (a stray key): not ours to judge or delete
        key = f"{st}/.staging/{name}"
        size, newest = files.usage(key)
        if store.read_manifest(st, name) is not None:
            why = f"leftover staging of the published {st}/{name} (a run stopped before deleting it)"
        else:
            when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(newest))
            why = f"unfinished build of {st}/{name}, last written {when}; a rerun with the same settings would "
            why += "resume from it"
        yield Garbage(key, files.where(key), st, name, size, why + suffix, store.is_locked(st, name), local=local)
    for name in files.subdirs(f"{st}/.trash"):
        key = f"{st}/.trash/{name}"
        why = "a discarded version whose deletion was interrupted"
        yield Garbage(key, files.where(key), st, "", files.usage(key)[0], why + suffix, local=local)
    if local:  # cached copies of published versions: fetched again when needed
        for name in files.subdirs(st):
            if VERSION_RE.fullmatch(name):
                key = f"{st}/{name}"
                why = f"this machine's copy of {st}/{name} (downloaded again when a build needs it)"
                in_use = store.is_locked(st, name)  # a build here may be reading it
                yield Garbage(key, files.where(key), st, name, files.usage(key)[0], why, in_use, local=True)
        return
    if files.remote:
        yield from _other_builds(store, files, st)
    for name in files.names(f"{st}/.locks"):
        version = name.removesuffix(".lock")
        if not name.endswith(".lock") or not VERSION_RE.fullmatch(version):
            continue
        if not files.exists(f"{st}/{version}") and not files.exists(f"{st}/.staging/{version}"):
            key = f"{st}/.locks/{name}"
            why = f"the lock file of {st}/{version}, which is neither published nor being built"
            yield Garbage(key, files.where(key), st, version, 0, why, store.is_locked(st, version))


def _other_builds(store: Versions, files: Files, st: str) -> Iterator[Garbage]:
    """On an object store, the build folders in a version that its manifest does not name: builds killed or
    stopped (their lock lost) before their manifest, or replaced since."""
    for name in files.subdirs(st):
        if name.startswith(".") or not VERSION_RE.fullmatch(name):
            continue
        manifest = store.read_manifest(st, name)
        if manifest is None:  # builds write only into folders of their own: these files no build will publish
            for rel in files.names(f"{st}/{name}"):
                if rel != MANIFEST:  # a damaged one goes with its version
                    key = f"{st}/{name}/{rel}"
                    why = f"a file in {st}/{name}, which has no manifest naming it"
                    yield Garbage(key, files.where(key), st, name, files.usage(key)[0], why, store.is_locked(st, name))
        keep = files_prefix(manifest) if manifest is not None else "/"
        if not keep:
            continue  # published with its files in the version itself: every folder is its own
        for folder in files.subdirs(f"{st}/{name}"):
            if f"{folder}/" != keep:
                key = f"{st}/{name}/{folder}"
                why = f"files of a build of {st}/{name} that did not publish them (killed, lost its lock, or replaced)"
                yield Garbage(key, files.where(key), st, name, files.usage(key)[0], why, store.is_locked(st, name))


def _unchanged(store: Versions, item: Garbage) -> bool:
    """Whether the published version ``item`` names is still the one listed: the same build (a stale one), or
    still damaged; a run may have rebuilt it between the listing and the lock."""
    manifest, damage = store.checked_manifest(item.stage, item.version)
    if not item.build_id:
        return damage is not None
    return manifest is not None and manifest["build_id"] == item.build_id


def collect(store: Versions, item: Garbage) -> bool:
    """Delete ``item`` under its version's lock, taken now (the listing's ``in_use`` is already old: a run may
    have pinned or locked it since), and the lock file with it; False when a run builds or reads it, or rebuilt
    it since it was listed."""
    files = PosixFiles(store.files.local) if item.local else store.files
    if not item.version:
        files.delete(item.key)
        return True
    with store.try_lock(item.stage, item.version) as taken:
        if not taken or (item.published and not _unchanged(store, item)):
            return False
        if item.published:
            store.discard(item.stage, item.version, item.reason)
        else:
            files.delete(item.key)
        if not store.files.exists(store._version_key(item.stage, item.version)):
            store._unlink_lock(item.stage, item.version)  # under the lock
        return True
