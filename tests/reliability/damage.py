"""Damaged artifacts (published or in train staging): each must be detected, logged and rebuilt."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

from tasks.core.faults import FAULT_ENV
from tasks.registry import STAGES, open_store
from tasks.store import MANIFEST
from tests.reliability.digests import stage_digests
from tests.reliability.environment import captured_logs, env_vars


def tiny_stage_params(url: str):
    """The tiny preset's settings, downloading from ``url``."""
    from flows.settings import TINY, Pipeline

    return Pipeline.parse(**{**TINY, "corpus": {"source_url": url}})


def build_plain(root: Path, url: str, params, *, full_check: bool = False) -> dict:
    """The tiny pipeline as plain stage calls (no Prefect): {stage: ref}."""
    if params.corpus.source_url != url:
        raise ValueError("build_plain: params were made for another source_url")
    run = params.run.model_copy(update={"artifacts_dir": str(root), "full_check": full_check, "force": ()})
    refs: dict = {}
    for stage in STAGES:
        refs[stage.name] = stage.task.fn(*(refs[name] for name in stage.inputs), getattr(params, stage.name), run)
    return refs


def train_again(root: Path, refs: dict, params) -> dict:
    """The model stage alone on ``refs``' shards and tokenizer."""
    from tasks.model import train_model

    run = params.run.model_copy(update={"artifacts_dir": str(root)})
    return train_model.fn(refs["shards"], refs["tokenizer"], params.model, run)


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    i = data.index(b'"merges"') + 2  # a letter inside the JSON key: same size, still valid UTF-8
    data[i] ^= 0x20
    path.write_bytes(bytes(data))


def _truncate(path: Path, by: int = 100) -> None:
    with open(path, "r+b") as f:
        f.truncate(max(0, path.stat().st_size - by))


def _edit_manifest(path: Path) -> None:
    m = json.loads((path / MANIFEST).read_text())
    rel = sorted(m["files"])[0]
    m["files"][rel]["size"] += 1
    (path / MANIFEST).write_text(json.dumps(m, indent=2))


def damage_cases(root: Path, url: str, reference: dict) -> list[dict]:
    """Damage an artifact, rerun: the reason must be logged and the version rebuilt, equal to the reference."""
    from tasks.core.faults import FaultInjected, reset_faults

    params = tiny_stage_params(url)
    store = open_store(root)
    build_plain(root, url, params)
    rows = []

    def case(name, stage, damage, *, reason, full_check=False, also_quick=False):
        refs = build_plain(root, url, params)
        version = refs[stage]["version"]
        target = damage(store.version_path(stage, version), refs)
        row = {"case": name, "target": target, "expect": reason}
        if also_quick:  # what the quick check says: the same-size flip passes it
            row["quick_check"] = "missed (same size)" if store.verify(stage, version)[0] else "detected"
        with captured_logs() as lines:
            refs2 = build_plain(root, url, params, full_check=full_check)
        warned = [line for line in lines if re.search(reason, line)]
        row["logged"] = warned[0] if warned else "(nothing logged)"
        ok, _why = store.verify(stage, refs2[stage]["version"], full=True)
        same = stage_digests(root, stage, refs2[stage]["version"]) == reference[stage]
        rebuilt = refs2[stage]["build_id"] != refs[stage]["build_id"]
        row["rebuilt"] = "yes" if rebuilt else "NO"
        row["detected"] = bool(warned) and ok and same and rebuilt
        rows.append(row)

    def shard(path, refs):
        p = path / "train-00001.parquet"
        _truncate(p)
        return "shards/<v>/train-00001.parquet truncated by 100 B"

    def tok_flip(path, refs):
        _flip_byte(path / "tokenizer.json")
        return "tokenizer/<v>/tokenizer.json: one byte flipped (same size)"

    def ckpt_gone(path, refs):
        (path / "model.ckpt").unlink()
        return "model/<v>/model.ckpt deleted"

    def ckpt_cut(path, refs):
        _truncate(path / "model.ckpt", 4096)
        return "model/<v>/model.ckpt truncated by 4 KiB"

    def corpus_cut(path, refs):
        _truncate(path / "wiki.train.txt", 1)
        return "corpus/<v>/wiki.train.txt truncated by 1 B"

    def manifest_edit(path, refs):
        _edit_manifest(path)
        return "shards/<v>/manifest.json: a file's size edited"

    def stray(path, refs):
        (path / "notes.txt").write_text("stray\n")
        return "samples/<v>/notes.txt added (not in the manifest)"

    truncated = r"damaged \('train-00001.parquet' is \d+ bytes, manifest says \d+\)"
    case("truncated shard", "shards", shard, reason=truncated)
    case(
        "byte flipped in tokenizer.json",
        "tokenizer",
        tok_flip,
        full_check=True,
        also_quick=True,
        reason=r"damaged \('tokenizer.json' does not match its sha256",
    )
    case("model.ckpt deleted", "model", ckpt_gone, reason=r"damaged \('model.ckpt' is missing\)")
    case("model.ckpt truncated", "model", ckpt_cut, reason=r"damaged \('model.ckpt' is \d+ bytes")
    case("corpus split truncated", "corpus", corpus_cut, reason=r"damaged \('wiki.train.txt' is \d+ bytes")
    case(
        "manifest no longer matches its files",
        "shards",
        manifest_edit,
        reason=r"damaged \(.* is \d+ bytes, "
        r"manifest says \d+\)",
    )
    case(
        "stray file in a version",
        "samples",
        stray,
        reason=r"damaged \(unexpected file\(s\) not in the manifest: 'notes.txt'",
    )

    # The in-progress checkpoint in train staging: unpublish the model, crash its rebuild (in-process stand-in:
    # FaultInjected) after the step-10 checkpoint, damage that checkpoint, rerun.
    def staged_ckpt(damage_fn):
        def damage(path, refs):
            store.discard("model", refs["model"]["version"], "the harness unpublished it to rebuild it")
            reset_faults()
            with env_vars(**{FAULT_ENV: "model.progress@4:raise"}), contextlib.suppress(FaultInjected):
                train_again(root, refs, params)
            reset_faults()
            ckpt = next(root.glob("model/.staging/*/work/train.ckpt"))
            return damage_fn(ckpt)

        return damage

    def cut_staged(ckpt):
        _truncate(ckpt, 2048)
        return "model/.staging/<v>/work/train.ckpt (step 10) truncated by 2 KiB"

    def del_staged(ckpt):
        ckpt.unlink()
        return "model/.staging/<v>/work/train.ckpt (step 10) deleted"

    def keep_staged(ckpt):
        return "model/.staging/<v>/work/train.ckpt (step 10) intact (control)"

    for name, fn, reason, resume in (
        (
            "resume checkpoint in train staging truncated",
            cut_staged,
            r"model: cannot resume \(.*\); starting from step 0",
            0,
        ),
        ("resume checkpoint in train staging deleted", del_staged, r"model: building model/", 0),
        ("resume checkpoint in train staging intact (control)", keep_staged, r"model: resuming from step 10", 10),
    ):
        _staged_case(rows, root, url, params, store, reference, name, staged_ckpt(fn), reason, resume)
    return rows


def _staged_case(rows, root, url, params, store, reference, name, damage, reason, resume) -> None:
    """A crashed rebuild's resume checkpoint, damaged: the next run must resume or restart as ``resume`` says."""
    refs = build_plain(root, url, params)
    target = damage(None, refs)
    with captured_logs() as lines:
        ref = train_again(root, refs, params)
    warned = [line for line in lines if re.search(reason, line)]
    resumed = store.get("model", ref["version"]).manifest["metrics"]["resumed_from"]
    ok, _ = store.verify("model", ref["version"], full=True)
    same = stage_digests(root, "model", ref["version"]) == reference["model"]
    rows.append(
        {
            "case": name,
            "target": target,
            "expect": reason,
            "logged": warned[0] if warned else "(nothing logged)",
            "rebuilt": f"trained from step {resumed}",
            "detected": bool(warned) and ok and same and resumed == resume and not list(root.glob("model/.staging/*")),
        }
    )
