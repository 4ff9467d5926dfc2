"""An artifact root is a plain directory: moved (``mv a b``) it is reused as it is; copied (``cp -a a b``), a run
on the copy reads only the copy and records nothing of the original."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from tasks.registry import NAMES, open_store
from tests.support.prefect_server import rebuilt_from, task_run_states
from tests.support.tiny import tiny_flow_parameters


def _run(url: str, root: Path, **groups):
    from flows.wiki_pipeline import wiki_pipeline

    state = wiki_pipeline(**tiny_flow_parameters(url, root, **groups), return_state=True)
    return state.result(), task_run_states(state.state_details.flow_run_id)


def _manifests_text(root: Path) -> str:
    return "\n".join(p.read_text() for p in root.glob("*/*/manifest.json"))


def _check(refs: dict, root: Path) -> None:
    store = open_store(root)
    for stage, ref in refs.items():
        assert Path(ref["path"]) == root / stage / ref["version"], f"{stage}: {ref['path']} is not under {root}"
        assert store.verify(stage, ref["version"], full=True) == (True, "ok"), stage


def test_a_moved_root_is_reused_and_a_copied_one_reads_only_itself(prefect_server, upstream, trained, tmp_path):
    original = upstream[0]  # corpus, tokenizer, shards and the model already built there
    url = (original.parent / "wikitext-103-raw-v1.zip").as_uri()
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    subprocess.run(["cp", "-a", str(original), str(a)], check=True)
    first, _ = _run(url, a)

    os.rename(a, b)  # mv a b
    moved, states = _run(url, b)
    assert states == dict.fromkeys(NAMES, "Cached")
    assert {s: (r["version"], r["build_id"]) for s, r in moved.items()} == {
        s: (r["version"], r["build_id"]) for s, r in first.items()
    }
    _check(moved, b)

    subprocess.run(["cp", "-a", str(b), str(c)], check=True)
    shutil.rmtree(b)  # whatever the run on the copy reads, it cannot be the original's
    copied, states = _run(url, c, run={"force": ["model"]})
    assert states == rebuilt_from("model")
    _check(copied, c)
    model = json.loads((Path(copied["model"]["path"]) / "manifest.json").read_text())
    assert {k: v for k, v in model["inputs"]["shards"].items() if k != "digest"} == {
        "stage": "shards",
        "version": copied["shards"]["version"],
        "build_id": copied["shards"]["build_id"],
    }
    assert len(model["inputs"]["shards"]["digest"]) == 64  # the input named by its bytes
    text = _manifests_text(c)
    assert not [root for root in (original, a, b) if str(root) in text], "a manifest records another root's path"
