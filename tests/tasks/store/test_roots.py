"""Artifact roots: one inside another root's stage folder or published version is refused, naming both."""

from __future__ import annotations

import pytest

from flows.cli import main
from mygpt.errors import UserError
from tasks.registry import open_store
from tests.tasks.store.builds import publish_locked


def test_a_root_inside_another_roots_version_or_stage_folder_is_refused(tmp_path, capsys):
    art = tmp_path / "art"
    store = open_store(art)
    publish_locked(store, "model", "m1", {"model.pt": b"weights"})
    version = f"the published version model/m1 of the artifact root {art}"
    stage = f"the stage folder model of the artifact root {art}"
    for inner, inside in [
        (art / "model" / "m1", version),
        (art / "model" / "m1" / "deeper", version),
        (art / "model", stage),
        (art / "model" / ".staging" / "m2", stage),
    ]:
        with pytest.raises(UserError) as err:
            open_store(inner)
        assert str(err.value).startswith(f"artifact root {inner} is inside {inside}: "), str(err.value)
    assert main(["artifacts", "--artifacts-dir", str(art / "model" / "m1")]) == 2
    assert f"is inside {version}" in capsys.readouterr().err
    assert sorted(p.name for p in (art / "model" / "m1").iterdir()) == ["manifest.json", "model.pt"]
    # the root itself, and a root beside it or holding it, are fine
    assert [v.version for v in open_store(art).versions()] == ["m1"]
    assert open_store(tmp_path / "other").versions() == []
    assert open_store(tmp_path).versions() == []


def test_a_symlink_to_another_roots_version_is_refused_like_the_version(tmp_path, capsys):
    art = tmp_path / "art"
    publish_locked(open_store(art), "model", "m1", {"model.pt": b"weights"})
    link = tmp_path / "mlink"
    link.symlink_to(art / "model" / "m1")
    with pytest.raises(UserError) as err:
        open_store(link)
    assert f"is inside the published version model/m1 of the artifact root {art}" in str(err.value)
    assert main(["artifacts", "--artifacts-dir", str(link / "sub")]) == 2
    assert "is inside the published version model/m1" in capsys.readouterr().err
    assert sorted(p.name for p in (art / "model" / "m1").iterdir()) == ["manifest.json", "model.pt"]


def test_a_run_with_a_root_inside_a_version_is_refused_before_anything_starts(tmp_path, capsys):
    art = tmp_path / "art"
    publish_locked(open_store(art), "model", "m1", {"model.pt": b"weights"})
    inner = art / "model" / "m1" / "sub"
    argv = ["run", "--tiny", "--artifacts-dir", str(inner), "--source-url", "http://127.0.0.1:9/wiki.zip"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"artifacts_dir {inner} is inside the published version model/m1" in err, err
    assert "Traceback" not in err and "Prefect server" not in err, "refused before a server started"
    assert not inner.exists()


def test_pull_into_a_published_version_is_refused(tmp_path, capsys):
    art = tmp_path / "art"
    store = open_store(art)
    publish_locked(store, "model", "m1", {"model.pt": b"weights"})
    publish_locked(store, "samples", "s1", {"samples.md": b"text"})
    inner = art / "model" / "m1" / "copy"
    assert main(["pull", "samples/s1", str(inner), "--artifacts-dir", str(art)]) == 2
    assert "is inside the published version model/m1" in capsys.readouterr().err
    assert sorted(p.name for p in (art / "model" / "m1").iterdir()) == ["manifest.json", "model.pt"]
    assert main(["pull", "samples/s1", str(tmp_path / "out"), "--artifacts-dir", str(art)]) == 0
    assert (tmp_path / "out" / "samples.md").read_bytes() == b"text"
