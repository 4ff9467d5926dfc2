"""corpus.kind=text: your own text (a file, a folder of .txt files, a URL) through the one writer: a document per
file or per `` = Title = `` block, split by a hash of its id; a split that would be empty is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.corpus import CorpusSettings


def test_a_setting_the_text_kind_does_not_read_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"corpus.kind=text does not read corpus.expected_bytes"):
        CorpusSettings(kind="text", source_url="file:///tmp/x.txt", expected_bytes=5)
    with pytest.raises(ValueError, match=r"corpus.kind=text needs corpus.source_url"):
        CorpusSettings(kind="text")


def _articles(n: int) -> str:
    return "".join(f" = Article {i} = \n\n Text of article {i} , with = = a section = = inside .\n\n" for i in range(n))


def test_a_text_file_of_titled_blocks_is_one_document_per_block_split_by_a_hash_of_its_id(tmp_path):
    """Each `` = Title = `` block is a document; each lands in the split its id's hash names, whole; the files are
    the chapter's header strip of the documents; the manifest lists the three splits and their files."""
    from tasks.corpora.source import split_of
    from tests.support.corpora import corpus_from_text
    from tests.support.corpus_runs import CHAPTER_RE, metrics

    text = _articles(60)
    ref = corpus_from_text(tmp_path / "art", tmp_path / "src", kind="text", text=text, article_index=True)
    m = metrics(ref)
    assert [f["split"] for f in m["split_files"]] == ["train", "valid", "test"]
    want: dict[str, str] = {"train": "", "valid": "", "test": ""}
    for i in range(60):
        want[split_of(f"corpus.txt#{i + 1} Article {i}", 0.05, 0.05)] += (
            f"\n = Article {i} = \n\n Text of article {i} , with = = a section = = inside .\n"
        )
    out = Path(ref["path"])
    for split, raw in want.items():
        assert raw, split  # 60 documents: each split has some
        assert (out / f"wiki.{split}.txt").read_text(encoding="utf-8") == CHAPTER_RE.sub("", raw)
        assert m["splits"][split]["articles"] == m["splits"][split]["documents"] == raw.count(" = Article ")


def test_a_folder_of_txt_files_is_one_document_per_file_and_named_by_its_listing(tmp_path):
    from tests.support.corpus_runs import metrics

    folder = tmp_path / "books"
    (folder / "sub").mkdir(parents=True)
    for i in range(40):
        (folder / ("sub" if i % 2 else "") / f"b{i:02d}.txt").write_text(f"book {i} line\n", encoding="utf-8")
    (folder / "notes.md").write_text("not read\n", encoding="utf-8")
    ref = stages_corpus(tmp_path / "art", folder.as_uri())
    m = metrics(ref)
    assert sum(m["splits"][s]["documents"] for s in ("train", "valid", "test")) == 40
    joined = b"".join((Path(ref["path"]) / f["text"]).read_bytes() for f in m["split_files"])
    assert sorted(joined.decode().split("\n")[:-1]) == sorted(f"book {i} line" for i in range(40))
    again = stages_corpus(tmp_path / "art", folder.as_uri())
    assert again["version"] == ref["version"]  # the same listing: the same version
    (folder / "b00.txt").rename(folder / "renamed.txt")
    assert stages_corpus(tmp_path / "art", folder.as_uri())["version"] != ref["version"]


def test_a_text_whose_split_would_be_empty_is_refused_naming_the_fix(tmp_path):
    from mygpt.errors import UserError
    from tests.support.corpora import corpus_from_text

    with pytest.raises(UserError, match=r"would be empty .* raise corpus.valid_fraction / corpus.test_fraction"):
        corpus_from_text(tmp_path / "art", tmp_path / "src", kind="text", text="one book, no titles\n")
    assert not list((tmp_path / "art" / "corpus").glob("[0-9a-f]*"))  # nothing published


def test_a_text_url_is_read_through_the_fetching_room(tmp_path):
    from flows.mirror import Mirror
    from tests.support.corpus_runs import metrics

    data = _articles(60).encode()
    with Mirror({"/book.txt": data}) as server:
        ref = stages_corpus(tmp_path / "art", server.url("/book.txt"))
    m = metrics(ref)
    assert sum(st["documents"] for st in m["splits"].values()) == 60
    assert m["source_url_sha256"] and m["kind"] == "text"


def stages_corpus(root, url: str, **settings):
    from tests.support import stages

    return stages.corpus(root, kind="text", source_url=url, **settings)


def test_a_link_in_an_allowed_folder_to_a_file_outside_the_allowed_sources_is_refused_unread(tmp_path, monkeypatch):
    """The allow-list judges the folder's URL; a ``.txt`` link inside it to another file (here a stand-in for the
    worker's ``/proc/self/environ``) is refused naming the link, and nothing of the target is published."""
    from mygpt.errors import UserError

    folder = tmp_path / "books"
    folder.mkdir()
    for i in range(40):
        (folder / f"b{i:02d}.txt").write_text(f"book {i} line\n", encoding="utf-8")
    secret = tmp_path / "private" / "environ"
    secret.parent.mkdir()
    secret.write_text("AWS_SECRET_ACCESS_KEY=hunter2\n", encoding="utf-8")
    (folder / "zz.txt").symlink_to(secret)
    monkeypatch.setenv("WIKI_PIPELINE_ALLOWED_SOURCES", folder.as_uri() + "/")
    with pytest.raises(UserError, match=r"zz.txt is a link to file://.*/private/environ, outside the sources"):
        stages_corpus(tmp_path / "art", folder.as_uri())
    published = [p for p in (tmp_path / "art").rglob("*") if p.is_file()]
    assert not any(b"hunter2" in p.read_bytes() for p in published)
    (folder / "zz.txt").unlink()
    (folder / "zz.txt").symlink_to(folder / "b00.txt")  # a link that stays inside the allowed folder is read
    assert stages_corpus(tmp_path / "art", folder.as_uri())["version"]


def test_a_folder_file_rewritten_after_its_version_was_named_is_refused_not_read(tmp_path):
    """The version names each file's sha256; a file rewritten between the listing and its reading (another
    program still writing the folder) is refused instead of published under an id that names other bytes."""
    from types import SimpleNamespace

    from mygpt.errors import UserError
    from tasks.corpora.text import SOURCE
    from tasks.corpus import CorpusSettings

    folder = tmp_path / "books"
    folder.mkdir()
    for name in ("a.txt", "b.txt"):
        (folder / name).write_text(f"{name} as it was\n", encoding="utf-8")
    settings = CorpusSettings(kind="text", source_url=folder.as_uri())
    ctx = SimpleNamespace(
        source=SOURCE.identity(settings, SimpleNamespace(store=None, log=None, stage=None)), store=None
    )
    docs = SOURCE.documents(settings, ctx)
    assert next(docs).text == "a.txt as it was\n"
    (folder / "b.txt").write_text("b.txt rewritten\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"changed while this run was using it"):
        next(docs)


def test_a_documents_own_header_shaped_line_starts_no_article(tmp_path):
    from tests.support.corpora import corpus_from_text
    from tests.support.corpus_runs import metrics

    text = "".join(f" = Article {i} = \n\n Intro {i} .\n= Notes =\n Note {i} .\n\n" for i in range(60))
    m = metrics(corpus_from_text(tmp_path / "art", tmp_path / "src", kind="text", text=text, article_index=True))
    assert {s: m["splits"][s]["articles"] for s in m["splits"]} == {s: m["splits"][s]["documents"] for s in m["splits"]}


def test_one_text_under_two_file_names_is_two_versions_as_its_splits_differ(tmp_path):
    """A file's name is its documents' ``doc_id`` s, which pick their splits; so the same bytes under another name
    are other corpus files, and must be another version (two roots must never hold other bytes under one id)."""
    text = _articles(60)
    refs = []
    for name in ("a.txt", "b.txt"):
        path = tmp_path / "src" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        refs.append(stages_corpus(tmp_path / f"art-{name}", path.as_uri()))
    texts = [(Path(ref["path"]) / "wiki.test.txt").read_bytes() for ref in refs]
    assert texts[0] != texts[1]  # the names put other documents in the test split
    assert refs[0]["version"] != refs[1]["version"]


def test_a_folder_file_whose_name_is_not_utf8_is_refused_naming_it(tmp_path):
    import os

    from mygpt.errors import UserError

    folder = tmp_path / "books"
    folder.mkdir()
    for i in range(40):
        (folder / f"b{i:02d}.txt").write_text(f"book {i} line\n", encoding="utf-8")
    (Path(os.fsdecode(os.path.join(os.fsencode(folder), b"caf\xe9.txt")))).write_bytes(b"a Latin-1 name\n")
    with pytest.raises(UserError, match=r"the name b'caf\\xe9.txt' is not UTF-8; rename the file"):
        stages_corpus(tmp_path / "art", folder.as_uri())


def test_a_folder_that_holds_the_artifact_root_is_refused(tmp_path):
    """Else each run reads the corpus files the last one published (``wiki.*.txt``) as more text: a new version
    every run, each holding the one before."""
    from mygpt.errors import UserError

    folder = tmp_path / "project"
    folder.mkdir()
    for i in range(40):
        (folder / f"b{i:02d}.txt").write_text(f"book {i} line\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"holds the artifact root .*/project/artifacts, whose corpus files"):
        stages_corpus(folder / "artifacts", folder.as_uri())
    assert stages_corpus(tmp_path / "elsewhere", folder.as_uri())["version"]


def test_a_byte_order_mark_is_not_text(tmp_path):
    from tests.support.corpus_runs import metrics

    text = _articles(60)
    ref = corpus_from_text_bom(tmp_path, "\ufeff" + text)
    plain = corpus_from_text_bom(tmp_path / "plain", text)
    joined = [
        b"".join((Path(r["path"]) / f["text"]).read_bytes() for f in metrics(r)["split_files"]) for r in (ref, plain)
    ]
    assert joined[0] == joined[1]


def corpus_from_text_bom(tmp_path, text: str):
    from tests.support.corpora import corpus_from_text

    return corpus_from_text(tmp_path / "art", tmp_path / "src", kind="text", text=text)


def test_a_bad_byte_after_a_byte_order_mark_is_named_at_its_offset_in_the_file(tmp_path):
    """The reviewer's: the mark dropped, the refusal still names the bad byte's offset in the file (5 here), not
    in the text after the mark (2)."""
    from mygpt.errors import UserError

    path = tmp_path / "src" / "corpus.txt"
    path.parent.mkdir()
    path.write_bytes(b"\xef\xbb\xbfab\xffcd\n")
    with pytest.raises(UserError, match=r"is not valid UTF-8 \(byte 0xff at offset 5\)"):
        stages_corpus(tmp_path / "art", path.as_uri())
