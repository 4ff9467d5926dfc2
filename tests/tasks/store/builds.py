"""Versions published by hand for the store's tests, and a one-file corpus stage."""

from __future__ import annotations

from tasks.core.settings import Settings
from tasks.core.stage import Stage
from tasks.registry import code_versions
from tasks.store import ArtifactStore


def publish_local(store: ArtifactStore, version: str = "v1", files: dict[str, bytes] | None = None) -> dict:
    build = store.open_build("corpus", version)
    for rel, data in (files or {"a.txt": b"alpha\n", "sub/b.bin": b"\x00\x01"}).items():
        (build.out / rel).parent.mkdir(parents=True, exist_ok=True)
        (build.out / rel).write_bytes(data)
    (build.work / "scratch.part").write_bytes(b"resume state")
    return build.publish(settings={"p": 1}, inputs={}, code_version="1", metrics={"m": 2})


def publish_locked(store: ArtifactStore, stage: str, version: str, files: dict[str, bytes], fault=None) -> dict:
    with store.lock(stage, version):
        build = store.open_build(stage, version)
        for rel, data in files.items():
            (build.out / rel).parent.mkdir(parents=True, exist_ok=True)
            (build.out / rel).write_bytes(data)
        return build.publish(settings={"a": 1}, inputs={}, code_version="1", fault=fault)


class Word(Settings):
    word: str = "x"


def write_word(ctx, settings: Word) -> dict:
    (ctx.out / "a.txt").write_text("hello " + settings.word)
    return {}


SOURCE = Stage("corpus", Word, code_versions()["corpus"], write_word, lambda m: "")
