"""The artifact store: versioned, immutable, atomically published stage outputs (docs/STORE.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from tasks.store.build import Build
from tasks.store.gc import Garbage, Leftovers, collect, find_garbage, stale_versions
from tasks.store.versions import VersionInfo, Versions


class ArtifactStore(Versions):
    """One artifact root, a directory or ``s3://bucket/prefix``: every stage reads and publishes through it."""

    def __init__(
        self,
        root: str | os.PathLike | None = None,
        stages: Sequence[str] = (),
        leftovers: Mapping[str, Leftovers] | None = None,
    ) -> None:
        """``stages``: the stages the root holds, in the order they run, for whole-root listings and gc;
        ``leftovers``: a stage's own finder of what in its folder no run needs (``tasks.registry.open_store``
        passes both)."""
        super().__init__(root, stages)
        self.leftovers: Mapping[str, Leftovers] = leftovers or {}

    def open_build(self, stage: str, version: str) -> Build:
        """The staging area for building ``stage/version`` (call under :meth:`lock`), resumable after a crash."""
        return Build(self, stage, version)

    def stale_versions(
        self, code_versions: dict[str, str], versions: list[VersionInfo] | None = None
    ) -> dict[tuple[str, str], str]:
        """``{(stage, version): why}`` for the published versions no run reuses (``code_versions``: each stage's
        current one; ``versions``: the root's listing when the caller has it)."""
        return stale_versions(self.versions() if versions is None else versions, code_versions)

    def garbage(self, code_versions: dict[str, str] | None = None) -> list[Garbage]:
        """What no run needs; with ``code_versions``, the stale published versions too."""
        return find_garbage(self, self.leftovers, code_versions)

    def collect(self, item: Garbage) -> bool:
        """Delete one :meth:`garbage` item under its version's lock; False when a run builds or reads it."""
        return collect(self, item)
