"""Fetching the model stage's shards on a real directory root (the tiny upstream versions): a resumed run never
trusts a leftover token file, what is flattened is what was hashed, and the budget's advice is a value that is
accepted."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from mygpt.errors import UserError
from mygpt.training.data import open_token_files
from tasks.core.shard_fetch import ENV_CACHE_MAX, cache_budget, fetch_shards, size_at_least
from tasks.core.shard_format import read_shard, shard_paths, write_shard
from tasks.registry import open_store


def _fetch(upstream, folder: Path):
    root, _, _, shards = upstream
    return fetch_shards(open_store(root), shards["version"], folder, ("train",))


def _valid(upstream) -> np.ndarray:
    return np.concatenate([read_shard(p) for p in shard_paths(upstream[3]["path"], "valid")])


def _read(paths: list[str], dtype: str) -> np.ndarray:
    tokens = open_token_files(paths, dtype)
    return np.array(tokens[0 : len(tokens)])


def test_a_resumed_run_brings_its_token_files_again_instead_of_trusting_what_was_left(upstream, tmp_path):
    folder = tmp_path / "t"
    data = _fetch(upstream, folder)
    for p in folder.glob("*.bin"):  # killed; the files overwritten with zeros of the same size
        p.write_bytes(bytes(p.stat().st_size))
    again = _fetch(upstream, folder)  # the rerun resumes in the same folder
    assert again.valid == data.valid and np.array_equal(_read(again.valid, again.dtype), _valid(upstream))
    train = np.concatenate([read_shard(p) for p in shard_paths(upstream[3]["path"], "train")])
    assert np.array_equal(_read(again.train, again.dtype), train)


def test_a_shard_changed_after_its_check_on_a_directory_root_is_not_read(upstream, tmp_path, monkeypatch):
    """What is flattened is the bytes that were hashed: a change to the published file between the check and
    the read (a directory root hands out the file itself) cannot reach training."""
    import tasks.core.shard_fetch as shard_fetch

    root, _, _, shards = upstream
    art = tmp_path / "art"
    shutil.copytree(root, art, ignore=shutil.ignore_patterns("model", "samples", "export", "evaluate"))
    published = Path(str(shards["path"]).replace(str(root), str(art))) / "valid-00000.parquet"
    good = read_shard(published)
    real = shard_fetch.flatten_shard

    def changed_in_between(shard, dest, *args, **kwargs):
        if Path(dest).name == "valid-00000.bin":
            write_shard(published, good[::-1].copy())  # same token count, other tokens
        return real(shard, dest, *args, **kwargs)

    monkeypatch.setattr(shard_fetch, "flatten_shard", changed_in_between)
    data = fetch_shards(open_store(art), shards["version"], tmp_path / "t", ("train",))
    got = _read(data.valid[:1], data.dtype)
    assert not np.array_equal(read_shard(published), good), "the published file did change"
    assert np.array_equal(got, good)


def test_the_budget_s_advice_is_a_value_that_is_accepted(upstream, tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_CACHE_MAX, "1")
    with pytest.raises(UserError, match=r"raise it to at least \S+ \([0-9,]+ bytes\)") as err:
        _fetch(upstream, tmp_path / "t")
    advice, exact = re.search(r"at least (\S+) \(([0-9,]+) bytes\)", str(err.value)).groups()
    monkeypatch.setenv(ENV_CACHE_MAX, advice)
    _fetch(upstream, tmp_path / "t")  # accepted
    monkeypatch.setenv(ENV_CACHE_MAX, exact.replace(",", ""))
    _fetch(upstream, tmp_path / "t")
    for n in [1, 1023, 1024, 1025, 93_950, 94_003, 10**9 + 1, 5 * 2**40 - 3]:
        monkeypatch.setenv(ENV_CACHE_MAX, size_at_least(n))
        assert cache_budget() >= n, size_at_least(n)


def test_training_on_every_split_fetches_each_shard_once_and_the_budget_counts_it_once(upstream, tmp_path, monkeypatch):
    """``train_splits=all`` trains on valid's shards too: each one fetched and counted once, so the budget that
    holds exactly the token files on disk is accepted."""
    import tasks.core.shard_fetch as shard_fetch

    root, _, _, shards = upstream
    store, folder = open_store(root), tmp_path / "t"
    fetched: list[str] = []
    real = store.fetch_bytes

    def counted(stage, version, rel, *args, **kwargs):
        fetched.append(rel)
        return real(stage, version, rel, *args, **kwargs)

    monkeypatch.setattr(store, "fetch_bytes", counted)
    data = shard_fetch.fetch_shards(store, shards["version"], folder, ("train", "valid", "test"))
    tokens = [p for p in fetched if p.endswith(".parquet")]
    assert len(tokens) == len(set(tokens)) and any(p.startswith("valid-") for p in tokens)
    on_disk = sum(p.stat().st_size for p in folder.glob("*.bin"))
    assert set(data.valid) <= set(data.train)
    monkeypatch.setenv(ENV_CACHE_MAX, str(on_disk))
    shard_fetch.fetch_shards(store, shards["version"], folder, ("train", "valid", "test"))  # accepted


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0.5", "is below one byte: give at least 1"),
        ("\u0663\u0660G", "is not a size"),
        ("\uff13\uff10G", "is not a size"),
    ],
)
def test_a_budget_below_a_byte_or_in_other_digits_is_named(value, message, monkeypatch):
    monkeypatch.setenv(ENV_CACHE_MAX, value)
    with pytest.raises(UserError, match=rf"{ENV_CACHE_MAX}='{value}' {message}"):
        cache_budget()


def test_a_flattened_shard_holds_exactly_its_ids_and_is_written_without_an_fsync(upstream, tmp_path, monkeypatch):
    """The token files are the run's scratch cache (a killed run's are deleted unread), so the first step never
    waits for the disk to sync them; their bytes are the shard's ids, in order, in its dtype."""
    import pyarrow.parquet as pq

    import mygpt.atomic
    from tasks.core.shard_format import flatten_shard

    synced: list[int] = []
    monkeypatch.setattr(mygpt.atomic.os, "fsync", lambda fd: synced.append(fd))
    for path in shard_paths(upstream[3]["path"], "train")[:2]:
        ids = read_shard(path)
        plain = pq.read_table(path)["token_id"].to_numpy()  # pyarrow's own reading, as the schema's docs give it
        assert ids.dtype == plain.dtype and np.array_equal(ids, plain)
        dest = tmp_path / path.with_suffix(".bin").name
        flatten_shard(path.read_bytes(), dest, ids.dtype, ids.size, name=path.name)
        assert dest.read_bytes() == ids.tobytes()
    assert synced == []


def test_flattening_or_reading_a_shard_never_imports_pandas(upstream, tmp_path):
    """The model stage's process flattens every shard it fetches; pyarrow's ``to_numpy`` would import pandas there
    (seconds before the first step, and its memory) only to convert a buffer numpy reads as it is."""
    import subprocess
    import sys

    path = shard_paths(upstream[3]["path"], "train")[0]
    code = (
        "import sys, numpy as np\n"
        "from tasks.core.shard_format import flatten_shard, shard_tokens_in\n"
        f"p, dest = {str(path)!r}, {str(tmp_path / 'f.bin')!r}\n"
        f"flatten_shard(open(p, 'rb').read(), dest, np.{read_shard(path).dtype}, shard_tokens_in(p))\n"
        "from tasks.core.shard_format import read_shard\n"
        "assert read_shard(p).size == shard_tokens_in(p)\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert (tmp_path / "f.bin").read_bytes() == read_shard(path).tobytes()


def test_a_token_file_a_killed_run_was_writing_is_deleted_when_the_next_run_starts(upstream, tmp_path):
    """A process killed (SIGKILL) while writing a token file leaves atomic_open's temp file: the next fetch
    deletes it before it starts, and nothing in the folder that is not such a file."""
    import subprocess
    import sys

    folder = tmp_path / "t"
    folder.mkdir()
    killed = subprocess.run(
        [sys.executable, "-c", "import os, signal, sys\nfrom mygpt.atomic import atomic_open\n"
         "with atomic_open(sys.argv[1], 'wb', durable=False) as f:\n"
         "    f.write(b'half'); f.flush(); os.kill(os.getpid(), signal.SIGKILL)\n", str(folder / "train-00000.bin")],
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert killed.returncode == -9
    partial = [p.name for p in folder.iterdir()]
    assert len(partial) == 1 and re.fullmatch(r"\.train-00000\.bin\..+\.tmp", partial[0])
    kept = ["notes.tmp", "train-00000.bin.x.tmp", ".train-00000.bin.x.tmp.keep", ".valid-00000.bin.x.tmp"]
    for name in kept[:3]:
        (folder / name).write_bytes(b"not ours")
    (folder / kept[3]).mkdir()
    _fetch(upstream, folder)
    left = {p.name for p in folder.iterdir()}
    assert partial[0] not in left and set(kept) <= left


def test_the_budget_holds_every_download_in_flight_at_once_on_an_object_store(monkeypatch):
    """Review: the shards are fetched ``fetch_threads()`` at a time, each download a file in ``.incoming`` until it
    is flattened; a budget that holds the token files and only one download let the fetch go past it."""
    import tasks.core.shard_fetch as shard_fetch

    monkeypatch.setattr(shard_fetch, "FETCH_THREADS", 4)
    monkeypatch.setattr(shard_fetch.os, "cpu_count", lambda: 8)
    assert shard_fetch.fetch_threads() == 4
    shards = [shard_fetch.Shard(f"train-{i:05d}.parquet", tokens=100, parquet_bytes=1000 + i) for i in range(8)]
    tokens = 8 * 100 * 2
    in_flight = 1007 + 1006 + 1005 + 1004  # the four largest downloads, on disk at once
    shard_fetch._check_budget(tokens + in_flight, shards, np.dtype(np.uint16), remote=True)
    with pytest.raises(UserError, match=r"and 4 downloads at once\); raise it to at least \S+ \(5,622 bytes\)"):
        shard_fetch._check_budget(tokens + in_flight - 1, shards, np.dtype(np.uint16), remote=True)
    shard_fetch._check_budget(tokens, shards, np.dtype(np.uint16), remote=False)  # a directory root: no download
    monkeypatch.setattr(shard_fetch.os, "cpu_count", lambda: 1)  # one thread: one download
    with pytest.raises(UserError, match=r"and one download\)"):
        shard_fetch._check_budget(tokens + 1006, shards, np.dtype(np.uint16), remote=True)


def test_a_damaged_shard_among_many_is_named_and_the_other_fetches_are_stopped(upstream, tmp_path, monkeypatch):
    """Review: with four fetch threads, a shard whose bytes are not the manifest's is the same clear error naming
    it; when it returns no fetch thread is still running, the shards not yet started were never fetched, and
    ``.incoming`` is gone."""
    import threading

    import tasks.core.shard_fetch as shard_fetch

    root, _, _, shards = upstream
    art = tmp_path / "art"
    shutil.copytree(root, art, ignore=shutil.ignore_patterns("model", "samples", "export", "evaluate"))
    store = open_store(art)
    names = sorted(store.get("shards", shards["version"]).manifest["files"])
    train = [n for n in names if n.startswith("train-") and n.endswith(".parquet")]
    assert len(train) >= 8
    damaged = train[2]
    published = Path(str(shards["path"]).replace(str(root), str(art))) / damaged
    data = bytearray(published.read_bytes())
    data[len(data) // 2] ^= 0xFF
    published.write_bytes(bytes(data))
    monkeypatch.setattr(shard_fetch, "FETCH_THREADS", 2)
    started: list[str] = []
    real = store.fetch_bytes

    def slow(stage, version, rel, *args, **kwargs):
        started.append(rel)
        if rel != damaged:
            threading.Event().wait(0.3)
        return real(stage, version, rel, *args, **kwargs)

    monkeypatch.setattr(store, "fetch_bytes", slow)
    folder = tmp_path / "t"
    with pytest.raises(UserError, match=re.escape(damaged)):
        fetch_shards(store, shards["version"], folder, ("train",))
    assert not [t for t in threading.enumerate() if t.name.startswith("fetch-shard")]
    assert not (folder / ".incoming").exists()
    assert len(started) <= 6 < len(train), started  # the shards after the failure and its neighbours: not fetched


def test_the_downloads_a_killed_run_left_are_deleted_before_the_next_fetch_starts(upstream, tmp_path, monkeypatch):
    """Review: a run killed (SIGKILL) mid-fetch on an object store leaves up to one download a fetch thread in
    ``.incoming``; they were deleted only at the end of the next fetch, on disk beside the budget meanwhile."""
    root, _, _, shards = upstream
    store = open_store(root)
    folder = tmp_path / "t"
    leftover = folder / ".incoming" / ".train-00000.parquet.0123abcd.part"
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"half a download")
    seen: list[bool] = []
    real = store.fetch_bytes

    def watched(stage, version, rel, *args, **kwargs):
        if rel.endswith(".parquet"):  # a shard (the index is read before anything is fetched)
            seen.append(leftover.exists())
        return real(stage, version, rel, *args, **kwargs)

    monkeypatch.setattr(store, "fetch_bytes", watched)
    fetch_shards(store, shards["version"], folder, ("train",))
    assert seen and not any(seen)
    assert not (folder / ".incoming").exists()
