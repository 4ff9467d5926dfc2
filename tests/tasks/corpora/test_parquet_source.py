"""corpus.kind=parquet: a Wikipedia Parquet export (columns id, url, title, text) through the one writer: a document
per row, split by a hash of its id, named by its bytes wherever they are; bad input refused, nothing published."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mygpt.errors import UserError
from tasks.corpora.source import split_of
from tests.support import stages
from tests.support.corpus_runs import CHAPTER_RE, metrics

_TITLE_RE = re.compile(r"^ = ([^=].*?) = $", re.MULTILINE)
_HEADING_RE = re.compile(r"^(?:= )+(.*?)(?: =)+$")


def _rows() -> list[dict]:
    """The articles of WikiText-2's validation file as an export's rows (string ids, as Hugging Face's have them),
    their text as an export gives it (paragraphs one blank line apart, headings plain lines, no wikitext spacing);
    ``want`` is what the corpus must hold for each. Some rows get Windows line ends, trailing spaces and extra blank
    lines, which the reading removes; a non-Latin row; a blank one, which is dropped."""
    from tests.support.shared_data import SHARED_DATA, absent

    path = SHARED_DATA / "wikitext2-valid.txt"
    if not path.is_file():
        absent(str(path))
    raw = path.read_text(encoding="utf-8")
    heads = list(_TITLE_RE.finditer(raw))
    rows = []
    for i, (head, nxt) in enumerate(zip(heads, [*heads[1:], None], strict=True)):
        body = raw[head.end() : nxt.start() if nxt else len(raw)]
        lines = (_HEADING_RE.sub(r"\1", line.strip()) for line in body.split("\n"))  # a heading: its words alone
        clean = "\n\n".join(line for line in lines if line)
        text = clean.replace("\n", "  \r\n") + "\n\n\n" if i % 3 == 0 else clean
        rows.append(
            {
                "id": str(1000 + i),
                "url": f"https://en.wikipedia.org/wiki?curid={1000 + i}",
                "title": head.group(1),
                "text": text,
                "want": clean + "\n",
            }
        )
    rows.insert(
        5,
        {
            "id": "77",
            "url": "u",
            "title": "東京",
            "text": "東京は日本の首都。\n人口は多い。 ",
            "want": "東京は日本の首都。\n\n人口は多い。\n",
        },
    )
    rows.insert(9, {"id": "78", "url": "u", "title": "Blank", "text": " \r\n\t\n", "want": ""})
    return rows


def _write(path: Path, rows: list[dict], schema: pa.Schema | None = None, **columns) -> Path:
    """``rows`` as a Parquet file at ``path``, in row groups of 8; ``columns`` replace whole columns."""
    data = {k: [r[k] for r in rows] for k in ("id", "url", "title", "text")} | columns
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(data, schema=schema), path, row_group_size=8)
    return path


def _want(rows: list[dict]) -> dict[str, str]:
    """Each split's text: the rows kept, in order, in the split their id's hash names, as the writer lays them out
    (a `` = Title = `` line, which the chapter's strip removes with the text's own heading lines)."""
    want = dict.fromkeys(("train", "valid", "test"), "")
    for r in rows:
        if r["want"]:
            want[split_of(r["id"], 0.1, 0.1)] += f"\n = {r['title']} = \n\n{r['want']}"
    return {split: CHAPTER_RE.sub("", text) for split, text in want.items()}


def corpus(root: Path, url: str, **settings):
    return stages.corpus(root, kind="parquet", source_url=url, valid_fraction=0.1, test_fraction=0.1, **settings)


def _texts(ref) -> dict[str, str]:
    return {
        f["split"]: (Path(ref["path"]) / f["text"]).read_text(encoding="utf-8") for f in metrics(ref)["split_files"]
    }


def _published(root: Path) -> list[Path]:
    return list((root / "corpus").glob("[0-9a-f]*"))


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return _rows()


def test_a_file_is_one_document_per_row_with_text_split_by_a_hash_of_its_id(tmp_path, rows):
    from tasks.corpus import report

    ref = corpus(tmp_path / "art", _write(tmp_path / "src" / "train.parquet", rows).as_uri(), article_index=True)
    want = _want(rows)
    assert all(want.values())
    assert _texts(ref) == want
    m = metrics(ref)
    kept = len(rows) - 1
    counts = (m["parquet_files"], m["parquet_rows"], m["parquet_kept"], m["parquet_dropped_empty"])
    assert counts == (1, len(rows), kept, 1)
    assert sum(st["documents"] for st in m["splits"].values()) == sum(st["articles"] for st in m["splits"].values())
    assert sum(st["documents"] for st in m["splits"].values()) == kept
    manifest = json.loads((Path(ref["path"]) / "manifest.json").read_text(encoding="utf-8"))
    assert f"{len(rows):,} in 1 file(s): {kept:,} kept; dropped 1 empty" in report(manifest)


def test_a_folder_of_shards_reads_them_in_order_of_their_paths_as_one_file_would(tmp_path, rows):
    folder = tmp_path / "20231101.en"
    half = len(rows) // 2
    _write(folder / "train-00001-of-00002.parquet", rows[half:])
    _write(folder / "train-00000-of-00002.parquet", rows[:half])
    (folder / "README.md").write_text("not read\n", encoding="utf-8")
    ref = corpus(tmp_path / "art", folder.as_uri())
    assert _texts(ref) == _want(rows)
    assert metrics(ref)["parquet_files"] == 2
    moved = tmp_path / "elsewhere" / "copy"
    shutil.copytree(folder, moved)
    assert corpus(tmp_path / "art", moved.as_uri())["version"] == ref["version"]  # the same listing and bytes


def test_the_version_names_the_bytes_wherever_they_are_served_from(tmp_path, rows):
    """The same bytes at two paths and over HTTP: one version (its text reused); one changed byte: another."""
    from flows.mirror import Mirror

    a = _write(tmp_path / "a" / "train.parquet", rows)
    b = tmp_path / "b" / "other-name.parquet"
    b.parent.mkdir()
    b.write_bytes(a.read_bytes())
    ref = corpus(tmp_path / "art", a.as_uri())
    assert corpus(tmp_path / "art", b.as_uri())["version"] == ref["version"]
    with Mirror({"/20231101.en/train-00000-of-00001.parquet": a.read_bytes()}) as server:
        served = corpus(tmp_path / "served", server.url("/20231101.en/train-00000-of-00001.parquet"))
    assert served["version"] == ref["version"]
    assert _texts(served) == _texts(ref)
    changed = [dict(r) for r in rows]
    changed[0]["text"] = changed[0]["text"].replace("a", "b", 1)
    assert corpus(tmp_path / "art", _write(a, changed).as_uri())["version"] != ref["version"]


def test_the_text_is_laid_out_in_wikitext_shape_and_nothing_more():
    from tasks.corpora.parquet import wikitext_shape

    assert wikitext_shape("One  \r\nTwo\r\rThree\n\n\n\n Four \t\n") == "One\n\nTwo\n\nThree\n\n Four\n"
    assert wikitext_shape("Heading\nA  b.") == "Heading\n\nA  b.\n"
    assert wikitext_shape(" \n\u3000\n") == ""


def test_a_setting_the_parquet_kind_does_not_read_is_refused():
    from tasks.corpus import CorpusSettings

    with pytest.raises(ValueError, match=r"corpus.kind=parquet does not read corpus.expected_bytes"):
        CorpusSettings(kind="parquet", source_url="file:///tmp/x.parquet", expected_bytes=5)
    with pytest.raises(ValueError, match=r"corpus.kind=parquet needs corpus.source_url"):
        CorpusSettings(kind="parquet")


def _bad(tmp: Path, case: str, rows: list[dict]) -> Path:
    """The input of each refusal: a file, or a folder."""
    few = rows[:20]
    if case == "not parquet":
        (tmp / "x.parquet").write_bytes(b"id,title,text\n1,A,b\n")
        return tmp / "x.parquet"
    if case == "truncated":
        whole = _write(tmp / "t.parquet", few).read_bytes()
        (tmp / "t.parquet").write_bytes(whole[: len(whole) // 2])
        return tmp / "t.parquet"
    if case == "no text column":
        return _write(
            tmp / "x.parquet",
            few,
            schema=pa.schema([("id", pa.string()), ("url", pa.string()), ("title", pa.string())]),
            text=None,
        )
    if case == "text of numbers":
        return _write(tmp / "x.parquet", few, text=list(range(len(few))))
    if case == "id of floats":
        return _write(tmp / "x.parquet", few, id=[float(i) for i in range(len(few))])
    if case == "null text":
        return _write(tmp / "x.parquet", few, text=[r["text"] if i != 10 else None for i, r in enumerate(few)])
    if case == "null id":
        return _write(tmp / "x.parquet", few, id=[r["id"] if i != 3 else None for i, r in enumerate(few)])
    if case == "text not utf-8":  # Parquet stores a string column's bytes unchecked
        bad = pa.array([r["text"].encode() if i != 5 else b"\xff\xfe bad\n" for i, r in enumerate(few)], pa.binary())
        return _write(tmp / "x.parquet", few, text=bad.view(pa.string()))
    if case == "text twice":
        table = pa.table({k: [r[k] for r in few] for k in ("id", "title", "text")})
        pq.write_table(table.append_column("text", table.column("text")), tmp / "x.parquet")
        return tmp / "x.parquet"
    if case == "no parquet in folder":
        (tmp / "notes.txt").write_text("a\n", encoding="utf-8")
        return tmp
    assert case == "an id twice"
    _write(tmp / "a.parquet", few)
    _write(tmp / "b.parquet", rows[20:40] + few[12:13])  # the 13th row (id 1010) again
    return tmp


BAD = {
    "not parquet": r"x.parquet is not a Parquet file \(it starts with b'id,t', not b'PAR1'\)",
    "truncated": r"t.parquet is damaged or truncated \(.*\); download it again",
    "no text column": r"x.parquet has no column 'text' \(its columns: id, url, title\)",
    "text of numbers": r"column 'text' is int64, not a string",
    "id of floats": r"column 'id' is double, not an integer or a string",
    "null text": r"row 2 of row group 1 has no text \(null\)",
    "null id": r"row 3 of row group 0 has no id \(null\)",
    "text not utf-8": r"x.parquet: row group 0 holds bytes that are not UTF-8 in a string column \(invalid start byte",
    "text twice": r"x.parquet has 2 columns named 'text'",
    "no parquet in folder": r"the folder holds no .parquet file; give a folder of .parquet files",
    "an id twice": r"id '1010' is in two rows \(row 4 of row group 1 of a.parquet of .*, and row 4 of row group 2 "
    r"of b.parquet of .*\); an id is a page id",
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_user_error_naming_it_and_nothing_is_published(tmp_path, rows, case):
    src = tmp_path / "src"
    src.mkdir()
    path = _bad(src, case, rows)
    with pytest.raises(UserError, match=BAD[case]):
        corpus(tmp_path / "art", path.as_uri())
    assert not _published(tmp_path / "art")


def test_a_file_that_changes_after_its_version_was_named_is_refused(tmp_path, rows, monkeypatch):
    """The bytes read are checked against the version's sha256, not only the bytes fetched."""
    import contextlib

    from tasks.corpora import parquet

    path = _write(tmp_path / "src" / "train.parquet", rows[:20])
    other = _write(tmp_path / "other.parquet", rows[20:40]).read_bytes()
    fetched = parquet.fetched_file

    @contextlib.contextmanager
    def swapped(*args, **kwargs):
        with fetched(*args, **kwargs) as got:
            Path(got.path).write_bytes(other)  # a late writer, between the check and the read
            yield got

    monkeypatch.setattr(parquet, "fetched_file", swapped)
    with pytest.raises(UserError, match=r"changed while this run was using it"):
        corpus(tmp_path / "art", path.as_uri())
    assert not _published(tmp_path / "art")


def test_a_wrong_expected_sha256_is_refused(tmp_path, rows):
    path = _write(tmp_path / "src" / "train.parquet", rows[:20])
    with pytest.raises(UserError, match=r"but expected_sha256 is " + "0" * 64):
        corpus(tmp_path / "art", path.as_uri(), expected_sha256="0" * 64)
    assert not _published(tmp_path / "art")


def test_an_integer_id_column_is_read_as_its_decimal_string(tmp_path, rows):
    path = _write(tmp_path / "src" / "train.parquet", rows, id=[int(r["id"]) for r in rows])
    assert _texts(corpus(tmp_path / "art", path.as_uri())) == _want(rows)
