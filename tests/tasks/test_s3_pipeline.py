"""The tiny pipeline on an s3:// artifact root (a real S3 API server on 127.0.0.1, tests/support/s3.py): every
stage publishes the same bytes as on a local root; the shards and the model stages, SIGKILLed mid-build, resume
from what they saved in the bucket when rerun as another machine would (another working directory, TMPDIR and
local cache); and ``only=``, ``artifacts`` and ``gc`` work there."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tasks.registry import NAMES, open_store
from tests.support import stages
from tests.support.s3 import environ_with
from tests.support.tiny import TINY, tiny_zip_url

_STAGE_IN_A_PROCESS = textwrap.dedent(
    """
    import json, sys
    from tests.support import stages
    from tests.support.tiny import TINY
    name, root, inputs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    ref = getattr(stages, name)(root, *inputs, run={**TINY["run"], "chunk_bytes": 65536}, **TINY.get(name, {}))
    print(json.dumps(ref))
    """
)


def _run_killed(name: str, root: str, inputs: list, fault: str, env: dict, cwd: Path) -> str:
    """Run stage ``name`` in a process of its own, SIGKILLed at the fault point ``fault``."""
    cwd.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-c", _STAGE_IN_A_PROCESS, name, root, json.dumps(inputs)],
        env={**env, "WIKI_PIPELINE_FAULT": fault, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == -9, proc.stderr[-3000:]
    return proc.stderr


# The files that record how long something took (the last stages' own: no version names them by their bytes):
# compared by :func:`_content`, the rest byte for byte.
MEASURED = {
    "samples": {"samples.json"},
    "evaluate": {"evaluate.json"},
}
_TIMING = ("seconds", "tokens_per_sec")


def _sv(ref) -> dict:
    return {"stage": ref["stage"], "version": ref["version"]}


def _content(path: Path):
    """A file's content without durations: JSON without the timing keys, CSV without its tokens_per_sec column,
    a checkpoint's weights."""
    if path.suffix == ".ckpt":
        import torch

        from mygpt.checkpoint import load_checkpoint_payload

        payload = load_checkpoint_payload(path)
        weights = {k: v.tolist() for k, v in payload["model_state_dict"].items() if torch.is_tensor(v)}
        return weights, payload["config"], payload["tokenizer_state"]
    if path.suffix == ".csv":
        rows = [line.split(",") for line in path.read_text().splitlines()]
        keep = [i for i, name in enumerate(rows[0]) if name not in _TIMING]
        return [[row[i] for i in keep] for row in rows]

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if not any(t in k for t in _TIMING)}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(json.loads(path.read_text()))


def _files(store, stage: str, version: str) -> dict[str, str]:
    return {rel: meta["sha256"] for rel, meta in store.get(stage, version).manifest["files"].items()}


def test_tiny_pipeline_on_s3_publishes_local_bytes_and_resumes_elsewhere(
    upstream, trained, s3_root, s3_endpoint, tmp_path, monkeypatch, caplog, capsys
):
    local_root, l_corpus, l_tokenizer, l_shards = upstream
    local = open_store(local_root)
    l_samples = stages.samples(local_root, trained, run=TINY["run"], **TINY["samples"])
    l_export = stages.export(local_root, l_corpus, l_shards, trained, run=TINY["run"])
    l_evaluate = stages.evaluate(local_root, l_corpus, l_shards, trained, run=TINY["run"], **TINY["evaluate"])

    corpus = stages.corpus(s3_root, run=TINY["run"], source_url=tiny_zip_url(tmp_path))
    tokenizer = stages.tokenizer(s3_root, corpus, run=TINY["run"], **TINY["tokenizer"])
    assert corpus["path"] == f"{s3_root}/corpus/{corpus['version']}"

    # machine A builds shards and is SIGKILLed after its second shard; machine B (another cache, cwd, TMPDIR)
    # resumes from what A saved in the bucket
    machine_a = environ_with(s3_endpoint, WIKI_PIPELINE_CACHE=str(tmp_path / "a-cache"), TMPDIR=str(tmp_path))
    _run_killed("shards", s3_root, [corpus, tokenizer], "shards.progress@6", machine_a, tmp_path / "a")
    store = open_store(s3_root)
    assert store.versions("shards") == []
    (building,) = store.files.subdirs("shards/.staging")
    saved = store.files.files(f"shards/.staging/{building}")
    assert "work/progress.json" in saved and any(rel.startswith("out/train-") for rel in saved), saved
    b_tmp = tmp_path / "b-tmp"
    b_tmp.mkdir()
    monkeypatch.setenv("WIKI_PIPELINE_CACHE", str(tmp_path / "b-cache"))
    monkeypatch.setenv("TMPDIR", str(b_tmp))
    monkeypatch.chdir(b_tmp)
    caplog.set_level("INFO")
    shards = stages.shards(s3_root, corpus, tokenizer, run={**TINY["run"], "chunk_bytes": 65536}, **TINY["shards"])
    assert "fetched" in caplog.text and "keeping" in caplog.text, caplog.text  # resumed, not started over

    # the model, SIGKILLed after a checkpoint, resumes on machine C from the checkpoint in the bucket
    machine_c = {**machine_a, "WIKI_PIPELINE_CACHE": str(tmp_path / "c-cache")}
    log = _run_killed("model", s3_root, [shards, tokenizer], "model.progress@5", machine_c, tmp_path / "c")
    staging = store.files.subdirs("model/.staging")
    assert len(staging) == 1, (log[-3000:], sorted(str(p) for p in (tmp_path / "c-cache").rglob("*")))
    training = staging[0]
    assert store.files.files(f"model/.staging/{training}").keys() >= {"work/train.ckpt"}
    model = stages.model(s3_root, shards, tokenizer, run=TINY["run"], **TINY["model"])
    assert "resuming from step" in caplog.text
    samples = stages.samples(s3_root, model, run=TINY["run"], **TINY["samples"])
    export = stages.export(s3_root, corpus, shards, model, run=TINY["run"])
    evaluate = stages.evaluate(s3_root, corpus, shards, model, run=TINY["run"], **TINY["evaluate"])

    # the same bytes as the local root's
    for ref, lref in zip(
        (corpus, tokenizer, shards, model, samples, export, evaluate),
        (l_corpus, l_tokenizer, l_shards, trained, l_samples, l_export, l_evaluate),
    ):
        # a version id names its inputs by their bytes, so each has the local one's id
        assert ref["version"] == lref["version"], ref["stage"]
        mine, theirs = _files(store, ref["stage"], ref["version"]), _files(local, lref["stage"], lref["version"])
        differ = sorted(rel for rel in set(mine) | set(theirs) if mine.get(rel) != theirs.get(rel))
        assert set(differ) <= MEASURED.get(ref["stage"], set()), (ref["stage"], differ)
        for rel in differ:  # files holding a duration or the version's own id: the same once those are left out
            mine_dir, theirs_dir = store.local_copy(ref["stage"], ref["version"]), Path(local.location(**_sv(lref)))
            assert _content(mine_dir / rel) == _content(theirs_dir / rel), (ref["stage"], rel)
        assert store.verify(ref["stage"], ref["version"], full=True) == (True, "ok")
    assert [v.stage for v in store.versions()] == list(NAMES)
    assert not any(store.files.files(f"{st}/.staging") for st in NAMES)  # no resume state left behind

    # the CLI on the bucket: artifacts lists it, pull copies a version out, every file checked
    from flows.cli import main

    assert main(["artifacts", "--artifacts-dir", s3_root]) == 0
    listing = capsys.readouterr()
    assert export["version"] in listing.out and s3_root in listing.out
    assert "wikitestsecret" not in listing.out + listing.err
    pulled = tmp_path / "pulled"
    assert main(["pull", f"export/{export['version']}", str(pulled), "--artifacts-dir", s3_root]) == 0
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(pulled)
    assert {p.name for p in pulled.iterdir()} >= set(_files(store, "export", export["version"]))


_DATA_STAGES = textwrap.dedent(
    """
    import json, sys
    from tests.support import stages
    from tests.support.tiny import TINY
    root, url = sys.argv[1], sys.argv[2]
    corpus = stages.corpus(root, run=TINY["run"], source_url=url)
    tokenizer = stages.tokenizer(root, corpus, run=TINY["run"], **TINY["tokenizer"])
    shards = stages.shards(root, corpus, tokenizer, run=TINY["run"], **TINY["shards"])
    print(json.dumps([corpus, tokenizer, shards]))
    """
)


def test_two_machines_at_once_build_each_version_once(s3_root, s3_endpoint, tmp_path):
    """Two runs of the data stages at once on one bucket, from two "machines" (caches, working directories):
    every version is built by one of them (one build id) and reused by the other."""
    url = tiny_zip_url(tmp_path)
    procs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        env = environ_with(s3_endpoint, WIKI_PIPELINE_CACHE=str(tmp_path / name / "cache"))
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _DATA_STAGES, s3_root, url],
                env=env,
                cwd=tmp_path / name,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert results[0] == results[1]  # the same versions with the same build ids: built once, reused once
    store = open_store(s3_root)
    assert [(v.stage, v.version) for v in store.versions()] == [(r["stage"], r["version"]) for r in results[0]]
    for ref in results[0]:
        assert store.verify(ref["stage"], ref["version"], full=True) == (True, "ok")


def test_an_outage_mid_shards_names_the_store_publishes_nothing_and_a_rerun_resumes(
    s3_root, s3_endpoint, tmp_path, monkeypatch, caplog
):
    import pytest

    from mygpt.errors import UserError
    from tasks.store import build as store_module
    from tests.support.s3 import Outage

    outage = Outage(s3_endpoint)  # the bucket's endpoint, through a relay that can be cut and restored
    monkeypatch.setenv("AWS_ENDPOINT_URL", outage.url)
    run = {**TINY["run"], "chunk_bytes": 65536}
    corpus = stages.corpus(s3_root, run=run, source_url=tiny_zip_url(tmp_path))
    tokenizer = stages.tokenizer(s3_root, corpus, run=run, **TINY["tokenizer"])
    real_save = store_module.Build.save
    saves: list = []

    def save_then_cut(self, *paths):  # the store goes away right after the second shard reached it
        real_save(self, *paths)
        saves.append(paths)
        if len(saves) == 2:
            outage.cut()

    monkeypatch.setattr(store_module.Build, "save", save_then_cut)
    with pytest.raises(UserError) as err:
        stages.shards(s3_root, corpus, tokenizer, run=run, **TINY["shards"])
    message = str(err.value)
    assert s3_root.removeprefix("s3://").split("/")[0] in message and "rerun" in message
    assert "wikitestsecret" not in message and "wikitestkey" not in message
    outage.restore()
    monkeypatch.setattr(store_module.Build, "save", real_save)
    store = open_store(s3_root)
    assert store.versions("shards") == []  # nothing half-published

    monkeypatch.setenv("WIKI_PIPELINE_CACHE", str(tmp_path / "another-machine"))
    caplog.set_level("INFO")
    ref = stages.shards(s3_root, corpus, tokenizer, run=run, **TINY["shards"])
    assert "fetched" in caplog.text and "keeping" in caplog.text, caplog.text
    assert store.verify("shards", ref["version"], full=True) == (True, "ok")
