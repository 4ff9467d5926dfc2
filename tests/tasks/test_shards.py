"""The shards stage (encode): shards decode back to the text, any reader can read them, Dask workers and crashes
don't change a byte."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from mygpt.errors import UserError
from mygpt.tokenizers.bpe import BPETokenizer
from tasks import shards as E
from tasks.core import shard_format as SF
from tasks.core.settings import RunOptions
from tasks.dask import work as dask_work
from tests.support import stages
from tests.support.corpora import corpus_from_text, shared_splits
from tests.support.corpus_runs import joined_splits

SHARD = 20_000
CHUNK = 100_000  # several chunks for train (~930 KB), one each for valid and test


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("enc-art")
    corpus = corpus_from_text(root, tmp_path_factory.mktemp("enc-src"), shared_splits())
    tokenizer = stages.tokenizer(
        root,
        corpus,
        num_merges=64,
        bpe_train_bytes=60_000,  # leaves some unknown chars
        run={"workers": 1},
    )
    return root, corpus, tokenizer


@pytest.fixture(scope="module")
def baseline(inputs):
    root, corpus, tokenizer = inputs
    return stages.shards(root, corpus, tokenizer, shard_tokens=SHARD, run={"workers": 1, "chunk_bytes": CHUNK})


def manifest(ref) -> dict:
    return json.loads((Path(ref["path"]) / "manifest.json").read_text())


def test_shards_decode_to_the_text_minus_unknown_chars(inputs, baseline):
    _, corpus, tokenizer = inputs
    tok = BPETokenizer.load(Path(tokenizer["path"]) / "tokenizer.json")
    out = Path(baseline["path"])
    m = manifest(baseline)
    assert m["settings"] == {"shard_tokens": SHARD, "unk_policy": "skip"}  # no workers / chunk_bytes
    skipped_total = 0
    for split in ("train", "valid", "test"):
        paths = SF.shard_paths(out, split)
        arrays = [SF.read_shard(p) for p in paths]
        assert all(a.dtype == np.uint16 for a in arrays)
        assert all(a.size == SHARD for a in arrays[:-1]) and 0 < arrays[-1].size <= SHARD
        ids = np.concatenate(arrays)
        text = (Path(corpus["path"]) / f"wiki.{split}.txt").read_text(encoding="utf-8")
        unknown = set(tok.unknown_chars(text))
        assert tok.decode(ids) == "".join(c for c in text if c not in unknown)
        sm = m["metrics"]["splits"][split]
        assert sm["tokens"] == ids.size and sm["chars"] == len(text) and sm["shards"] == len(paths)
        assert sm["skipped_positions"] == sum(1 for c in text if c in unknown)
        assert sm["skipped_distinct"] == len(unknown)
        skipped_total += sm["skipped_positions"]
        listed = [s for s in m["metrics"]["shards"] if s["split"] == split]
        assert [s["file"] for s in listed] == [p.name for p in paths]
        assert [s["tokens"] for s in listed] == [a.size for a in arrays]
        assert [s["first_token"] for s in listed] == list(np.cumsum([0] + [a.size for a in arrays[:-1]]))
        assert all(s["last_token"] == s["first_token"] + s["tokens"] - 1 for s in listed)
    assert skipped_total > 0
    index = json.loads((out / "shards.json").read_text())
    assert (
        index["dtype"] == "uint16" and index["splits"]["train"]["tokens"] == m["metrics"]["splits"]["train"]["tokens"]
    )
    readme = (out / "README.md").read_text()
    assert "token_id" in readme and "| train |" in readme
    assert "| train |" in E.STAGE.report(m)


def test_readable_with_pyarrow_pandas_and_duckdb(baseline):
    import duckdb
    import pandas as pd
    import pyarrow.parquet as pq

    out = Path(baseline["path"])
    paths = SF.shard_paths(out, "train")
    ours = np.concatenate([SF.read_shard(p) for p in paths])
    table = pq.read_table(paths[0])
    assert table.schema.names == ["token_id"] and str(table.schema.field(0).type) == "uint16"
    assert not table.schema.field(0).nullable
    assert np.array_equal(np.concatenate([pq.read_table(p)["token_id"].to_numpy() for p in paths]), ours)
    assert np.array_equal(np.concatenate([pd.read_parquet(p)["token_id"].to_numpy() for p in paths]), ours)
    con = duckdb.connect()
    rows = con.execute(
        "SELECT token_id FROM read_parquet(?, filename=true, file_row_number=true) ORDER BY filename, file_row_number",
        [str(out / "train-*.parquet")],
    ).fetchnumpy()["token_id"]
    assert np.array_equal(rows, ours)
    n = con.execute("SELECT count(*) FROM read_parquet(?)", [str(out / "valid-*.parquet")]).fetchone()[0]
    assert n == manifest(baseline)["metrics"]["splits"]["valid"]["tokens"]


def same_inputs_under(inputs, root: Path) -> tuple:
    """The fixture's corpus and tokenizer versions, copied under a fresh artifact root ``root``."""
    src, corpus, tokenizer = inputs
    for stage in E.STAGE.inputs:
        shutil.copytree(Path(src) / stage, root / stage)
    return root, corpus, tokenizer


def test_two_workers_give_identical_bytes(inputs, baseline, tmp_path, monkeypatch):
    from tasks.store import build as build_module

    read_back: list[str] = []
    real = build_module.sha256_file
    monkeypatch.setattr(build_module, "sha256_file", lambda path: read_back.append(path.name) or real(path))
    _, corpus, tokenizer = same_inputs_under(inputs, tmp_path / "art")
    ref = stages.shards(
        tmp_path / "art", corpus, tokenizer, shard_tokens=SHARD, run={"workers": 2, "chunk_bytes": CHUNK}
    )
    assert ref["version"] == baseline["version"]
    m2 = manifest(ref)
    assert m2["metrics"]["workers"] == 2 and m2["metrics"]["splits"]["train"]["shards"] > 5
    assert m2["files"] == manifest(baseline)["files"]  # every file's size and sha256
    assert read_back and not [n for n in read_back if n.endswith(".parquet")], "shards are hashed as written"


def test_kill_and_resume_keeps_finished_shards(inputs, baseline, tmp_path, monkeypatch):
    root, corpus, tokenizer = same_inputs_under(inputs, tmp_path / "art")
    calls = {"n": 0}
    real_write = SF.write_shard

    def failing_write(path, ids):
        if calls["n"] == 5:
            raise KeyboardInterrupt("simulated kill")
        calls["n"] += 1
        return real_write(path, ids)

    monkeypatch.setattr(SF, "write_shard", failing_write)
    with pytest.raises(KeyboardInterrupt):
        stages.shards(root, corpus, tokenizer, shard_tokens=SHARD, run={"workers": 1, "chunk_bytes": CHUNK})
    version = baseline["version"]
    staged = root / "shards" / ".staging" / version / "out"
    kept = sorted(staged.glob("*.parquet"))
    assert [p.name for p in kept] == [f"train-{i:05d}.parquet" for i in range(5)]
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in kept}
    assert not (root / "shards" / version).exists()

    # damage the last kept shard: it must be re-encoded, the others trusted
    damaged = kept[-1]
    damaged.write_bytes(damaged.read_bytes()[:-10])
    monkeypatch.setattr(SF, "write_shard", real_write)
    starts = []
    real_chunks = E.encoded_chunks

    def spy(client, key, state, path, where, chunk_bytes, unk_policy, start_chunk, **kwargs):
        starts.append(start_chunk)
        return real_chunks(client, key, state, path, where, chunk_bytes, unk_policy, start_chunk, **kwargs)

    monkeypatch.setattr(E, "encoded_chunks", spy)
    ref = stages.shards(root, corpus, tokenizer, shard_tokens=SHARD, run={"workers": 1, "chunk_bytes": CHUNK})
    assert starts[0] > 0  # sought to the chunk of shard 4, not re-encoded from the start
    out = Path(ref["path"])
    after = {name: ((out / name).stat().st_ino, (out / name).stat().st_mtime_ns) for name in before}
    assert {k: v for k, v in after.items() if k != damaged.name} == {
        k: v for k, v in before.items() if k != damaged.name
    }
    assert after[damaged.name] != before[damaged.name]
    assert manifest(ref)["files"] == manifest(baseline)["files"]  # byte-identical to an uninterrupted run
    assert not (root / "shards" / ".staging" / version).exists()


def test_death_between_last_shard_and_done_mark_resumes(inputs, baseline, tmp_path, monkeypatch):
    """Killed after a split's last shard is recorded (next_chunk null) but before "done" is written,
    a rerun used to fail for good (TypeError: None * int); it must finish the version, byte-identical."""
    root, corpus, tokenizer = same_inputs_under(inputs, tmp_path / "art")
    real_write = E.atomic_write_text

    def dies_before_done(path, text):
        rec = json.loads(text) if path.name == E.PROGRESS_FILE else None
        train = (rec or {}).get("splits", {}).get("train", {})
        if train.get("done"):
            raise KeyboardInterrupt("simulated kill: the done mark never reaches the disk")
        return real_write(path, text)

    monkeypatch.setattr(E, "atomic_write_text", dies_before_done)
    with pytest.raises(KeyboardInterrupt):
        stages.shards(root, corpus, tokenizer, shard_tokens=SHARD, run={"workers": 1, "chunk_bytes": CHUNK})
    record = json.loads((root / "shards" / ".staging" / baseline["version"] / "work" / E.PROGRESS_FILE).read_text())
    train = record["splits"]["train"]
    assert not train["done"] and train["shards"][-1]["next_chunk"] is None  # the wedge
    monkeypatch.setattr(E, "atomic_write_text", real_write)
    ref = stages.shards(root, corpus, tokenizer, shard_tokens=SHARD, run={"workers": 1, "chunk_bytes": CHUNK})
    assert manifest(ref)["files"] == manifest(baseline)["files"]
    assert (
        manifest(ref)["metrics"]["splits"]["train"]["tokens"]
        == manifest(baseline)["metrics"]["splits"]["train"]["tokens"]
    )


def test_missing_characters_are_the_chapters_analysis(inputs, baseline):
    """The encode pass's count of characters outside the alphabet = the chapter's analysis of wikipedia.txt."""
    _, corpus, tokenizer = inputs
    alphabet = set(BPETokenizer.load(Path(tokenizer["path"]) / "tokenizer.json").chars)
    full = joined_splits(Path(corpus["path"])).decode("utf-8")
    missing = {}
    for c in full:
        if c not in alphabet:
            missing[c] = missing.get(c, 0) + 1
    got = manifest(baseline)["metrics"]["missing"]
    assert got["corpus_chars"] == len(full) and got["missing_distinct"] == len(missing) > 0
    assert got["missing_positions"] == sum(missing.values())
    assert got["missing_fraction"] == pytest.approx(sum(missing.values()) / len(full))
    top = sorted(missing.items(), key=lambda kv: (-kv[1], kv[0]))[:20]
    assert [(t["char"], t["count"]) for t in got["missing_top"]] == top
    assert "missing from the tokenizer's alphabet" in E.STAGE.report(manifest(baseline))


def test_unk_policy_error_names_the_characters(inputs, tmp_path):
    _, corpus, tokenizer = same_inputs_under(inputs, tmp_path / "art")
    with pytest.raises(UserError, match=r"wiki\.train\.txt: .*characters not in the tokenizer's vocabulary"):
        stages.shards(tmp_path / "art", corpus, tokenizer, shard_tokens=SHARD, unk_policy="error", run={"workers": 1})
    assert not (tmp_path / "art" / "shards").exists() or not [
        p for p in (tmp_path / "art" / "shards").iterdir() if not p.name.startswith(".")
    ]


def test_empty_split_gets_one_empty_shard_and_vocab_dtype(tmp_path):
    root = tmp_path / "art"
    splits = {"train": " a b a b c\n" * 50, "valid": " = Only a header = \n", "test": " c a\n"}
    corpus = corpus_from_text(root, tmp_path / "src", splits)
    tokenizer = stages.tokenizer(root, corpus, num_merges=4, run={"workers": 1})
    ref = stages.shards(root, corpus, tokenizer, shard_tokens=40, run={"workers": 1})
    paths = SF.shard_paths(ref["path"], "valid")
    assert [p.name for p in paths] == ["valid-00000.parquet"] and SF.read_shard(paths[0]).size == 0
    sizes = [SF.read_shard(p).size for p in SF.shard_paths(ref["path"], "train")]
    assert len(sizes) > 2 and set(sizes[:-1]) == {40} and 1 <= sizes[-1] <= 40


def test_write_read_uint32_shard(tmp_path):
    ids = np.array([0, 70_000, 5, 2**32 - 1], dtype=np.uint32)
    SF.write_shard(tmp_path / "train-00000.parquet", ids)
    back = SF.read_shard(tmp_path / "train-00000.parquet")
    assert back.dtype == np.uint32 and np.array_equal(back, ids)
    assert SF.dtype_for_vocab(65536) == np.uint16 and SF.dtype_for_vocab(65537) == np.uint32


@pytest.mark.parametrize(
    "values, kind, wrong",
    [
        ([1, None, 3], "uint16", "its token_id column holds 1 null(s), a shard's holds none"),
        ([True, False, True], "bool", "its token_id column is of type bool, a shard's is uint16 or uint32"),
        (["1", "2", "3"], "string", "its token_id column is of type string, a shard's is uint16 or uint32"),
    ],
)
def test_a_shard_with_nulls_or_of_another_type_is_refused_naming_it(tmp_path, values, kind, wrong):
    """A damaged or foreign file where a shard should be: each reader names it, what is wrong and what to do,
    and leaves no token file behind."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "train-00000.parquet"
    pq.write_table(pa.table({SF.COLUMN: pa.array(values, type=pa.type_for_alias(kind))}), path)
    want = f"{path} is not a token shard as the shards stage writes it ({wrong}); rebuild the shards "
    want += "(run with --force shards)"
    with pytest.raises(UserError) as read:
        SF.read_shard(path)
    with pytest.raises(UserError) as flat:  # training's reader: the column's own type, so the dtype check passes
        SF.flatten_shard(path, tmp_path / "train.bin", pq.read_schema(path).field(SF.COLUMN).type.to_pandas_dtype(), 3)
    assert str(read.value) == str(flat.value) == want
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train-00000.parquet"]


def test_write_shard_bytes_and_digest_match_plain_pyarrow(tmp_path):
    """The shard built from the ids' buffer is the file pyarrow writes from ``pa.array`` with the documented
    options, and the size and sha256 it reports are the file's."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from mygpt.atomic import sha256_file

    rng = np.random.default_rng(3)
    cases = [
        np.zeros(0, np.uint16),
        rng.integers(0, 1164, SF.ROW_GROUP_TOKENS + 12_345).astype(np.uint16),
        rng.integers(0, 1164, 2 * 50_001).astype(np.uint16)[::2],  # a strided view
        rng.integers(0, 2**20, 70_000).astype(np.uint32),
    ]
    for i, ids in enumerate(cases):
        path = tmp_path / f"train-{i:05d}.parquet"
        written = SF.write_shard(path, ids)
        schema = pa.schema([pa.field(SF.COLUMN, SF.arrow_type(ids.dtype), nullable=False)])
        plain = io.BytesIO()
        pq.write_table(
            pa.Table.from_arrays([pa.array(ids, type=schema.field(0).type)], schema=schema),
            plain,
            compression=SF.COMPRESSION,
            use_dictionary=True,
            row_group_size=SF.ROW_GROUP_TOKENS,
            write_statistics=True,
        )
        assert path.read_bytes() == plain.getvalue()
        assert (written.size, written.sha256) == (path.stat().st_size, sha256_file(path))
        assert np.array_equal(SF.read_shard(path), ids)


def test_write_shard_does_not_import_pandas(tmp_path):
    """Writing a shard in a fresh process leaves pandas unimported (pyarrow would import it to inspect a numpy
    array, seconds spent in the shards stage for nothing)."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from tasks.core import shard_format as SF\n"
        f"SF.write_shard({str(tmp_path / 'train-00000.parquet')!r}, np.arange(1000, dtype=np.uint16))\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert SF.read_shard(tmp_path / "train-00000.parquet").tolist() == list(range(1000))


def test_shard_paths_reports_a_gap(tmp_path):
    SF.write_shard(tmp_path / "train-00000.parquet", np.arange(3, dtype=np.uint16))
    SF.write_shard(tmp_path / "train-00002.parquet", np.arange(3, dtype=np.uint16))
    with pytest.raises(UserError, match=r"missing shard train-00001\.parquet"):
        SF.shard_paths(tmp_path, "train")


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"shard_tokens": 0}, "shard_tokens must be an integer >= 1"),
        ({"shard_tokens": 1.0}, "shard_tokens must be an integer >= 1"),
        ({"shard_tokens": 10**13}, "shard_tokens must be at most 1,000,000,000 .* got 10000000000000"),
        ({"unk_policy": "ignore"}, "unk_policy must be one of skip, error"),
    ],
)
def test_settings_reject(settings, message):
    with pytest.raises(UserError, match=message):
        E.ShardsSettings.parse(settings)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"workers": 0}, "workers must be an integer >= 1"),
        ({"chunk_bytes": -1}, "chunk_bytes must be an integer >= 1"),
    ],
)
def test_run_options_reject(options, message):
    with pytest.raises(UserError, match=message):
        RunOptions.parse(options)


def test_workers_and_chunk_bytes_are_not_settings():
    assert "workers" not in E.ShardsSettings.model_fields and "chunk_bytes" not in E.ShardsSettings.model_fields
    assert E.ShardsSettings().version_params() == {"shard_tokens": 10_000_000, "unk_policy": "skip"}
    assert os.cpu_count() and dask_work.default_workers() >= 1


def test_huge_shard_tokens_is_refused_before_any_stage(tmp_path, capsys, monkeypatch):
    """``shard_tokens=10**13`` (an 18 TiB buffer) ends as ``error: ...``, exit 2, before anything runs."""
    from flows.cli import main

    monkeypatch.setenv("WIKI_PIPELINE_ARTIFACTS", str(tmp_path / "art"))
    assert main(["params", "--param", f"shard_tokens={10**13}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "error: shards.shard_tokens must be at most 1,000,000,000 (a shard is built in memory, "
        "18.2 TiB of uint16 ids at this size), got 10000000000000; the default 10000000 makes"
    )
    assert "Traceback" not in err and not (tmp_path / "art").exists()


def test_byte_kind_shards_end_each_article_with_endoftext(inputs, tmp_path):
    """tokenizer.kind=byte: each split's shards are, article by article (from the corpus's article index), the
    byte-level BPE's ids of the article then <|endoftext|>, whatever the chunks (cut only where both split patterns
    end a pre-token, mostly inside articles), on one worker or a local cluster of two."""
    root, _, _ = inputs
    corpus = corpus_from_text(root, tmp_path / "src", shared_splits(), article_index=True)
    tokenizer = stages.tokenizer(root, corpus, kind="byte", num_merges=40, bpe_train_bytes=60_000, run={"workers": 1})
    tok = E.load_tokenizer(Path(tokenizer["path"]))
    eot = tok.special_ids["<|endoftext|>"]
    one = stages.shards(root, corpus, tokenizer, shard_tokens=SHARD, run={"workers": 1, "chunk_bytes": 30_000})
    for stage in ("corpus", "tokenizer"):
        shutil.copytree(Path(root) / stage, tmp_path / "art" / stage)
    two = stages.shards(
        tmp_path / "art", corpus, tokenizer, shard_tokens=SHARD, run={"workers": 2, "chunk_bytes": 7_000}
    )
    assert two["version"] == one["version"]
    for split in ("train", "valid", "test"):
        data = (Path(corpus["path"]) / f"wiki.{split}.txt").read_bytes()
        starts = [int(x) for x in np.load(Path(corpus["path"]) / f"wiki.{split}.articles.npy")]
        articles = [data[a:b].decode("utf-8") for a, b in zip(starts, [*starts[1:], len(data)], strict=True)]
        assert starts[0] == 0 and len(articles) > 1
        want = np.concatenate([np.append(tok.encode_array(a), eot) for a in articles])
        for ref in (one, two):
            ids = np.concatenate([SF.read_shard(p) for p in SF.shard_paths(Path(ref["path"]), split)])
            assert ids.dtype == np.uint16 and np.array_equal(ids, want)
        assert int((ids == eot).sum()) == len(articles) and ids[-1] == eot
        assert tok.decode(ids[ids != eot]) == data.decode("utf-8")
    assert manifest(one)["metrics"]["vocab_size"] == 256 + 40 + 1


def test_byte_kind_needs_the_corpus_article_index(inputs, tmp_path):
    root, corpus, _ = inputs  # a byte-level tokenizer from a corpus with the index, shards from one without
    indexed = corpus_from_text(root, tmp_path / "src", shared_splits(), article_index=True)
    tokenizer = stages.tokenizer(root, indexed, kind="byte", num_merges=8, bpe_train_bytes=20_000, run={"workers": 1})
    with pytest.raises(
        UserError,
        match=r"has no article index .*corpus\.article_index=true \(the pipeline turns it on itself for "
        r"tokenizer\.kind=byte and tokenizer\.kind=pretrained\)$",
    ):
        stages.shards(root, corpus, tokenizer, shard_tokens=SHARD, run={"workers": 1})
