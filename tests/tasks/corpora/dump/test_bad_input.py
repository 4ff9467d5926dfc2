"""Bad dumps: each one clear UserError naming the file and what to do, and nothing extracted."""

from __future__ import annotations

import bz2
import shutil
from pathlib import Path

import pytest

from mygpt.errors import UserError
from tasks.corpora.dump import streams
from tasks.corpora.dump.adapter import DumpSource
from tasks.corpora.dump.pages import parse_pages
from tasks.corpora.dump.settings import DumpSettings
from tests.support.dump_sample import SamplePage, header_xml, write_dump

from .conftest import context


def extract(files, tmp_path: Path, **settings) -> list:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    s = DumpSettings(source_url=files.dump.as_uri(), **settings)
    return list(DumpSource(streams_per_range=2).documents(s, context(work)))


def copy(dump, tmp_path: Path):
    folder = tmp_path / "copy"
    shutil.copytree(dump.dump.parent, folder)
    return type(dump)(*(folder / p.name for p in (dump.dump, dump.index, dump.sha1sums)), dump.sha1)


def write_index(files, lines: list[str]) -> None:
    files.index.write_bytes(bz2.compress(("\n".join(lines) + "\n").encode()))


def index_lines(files) -> list[str]:
    return bz2.decompress(files.index.read_bytes()).decode().splitlines()


def test_a_sample_dump_extracts(dump, tmp_path):
    assert len(extract(dump, tmp_path)) > 10


def test_sha1_that_does_not_match_is_refused(dump, tmp_path):
    with pytest.raises(UserError, match=r"its sha1 is [0-9a-f]{40}, not the 0{40} corpus.expected_sha1 gives"):
        extract(dump, tmp_path, expected_sha1="0" * 40)
    files = copy(dump, tmp_path)
    files.sha1sums.write_text(f"{'1' * 40}  {files.dump.name}\n")
    with pytest.raises(UserError, match=r"not the 1{40} its sha1sums.txt gives: the download is damaged"):
        extract(files, tmp_path)
    files.sha1sums.write_text(f"{'1' * 40}  another-file.xml.bz2\n")
    with pytest.raises(UserError, match=r"has no sha1 for testwiki-20261101-pages-articles-multistream\.xml\.bz2"):
        extract(files, tmp_path)


def test_truncated_bz2_stream(dump, tmp_path):
    files = copy(dump, tmp_path)
    lines = index_lines(files)
    offsets = sorted({int(line.split(":")[0]) for line in lines})
    data = bytearray(files.dump.read_bytes())
    cut = offsets[3] + (offsets[4] - offsets[3]) // 2
    del data[cut : offsets[4]]  # stream 3 loses its second half; the streams after it move up
    files.dump.write_bytes(bytes(data))
    shift = offsets[4] - cut
    write_index(files, [f"{o - shift if o >= offsets[4] else o}:{rest}" for o, _, rest in (_split(x) for x in lines)])
    with pytest.raises(UserError, match=rf"the bz2 stream at byte {offsets[3]} is (truncated|damaged)"):
        extract(files, tmp_path, expected_sha1=_sha1(files.dump))


def test_index_offsets_out_of_order_out_of_range_or_off_the_streams(dump, tmp_path):
    files = copy(dump, tmp_path)
    lines = index_lines(files)
    sha1 = _sha1(files.dump)
    size = files.dump.stat().st_size
    swapped = lines[:]
    swapped[4], swapped[-1] = swapped[-1], swapped[4]
    cases = {
        "out of order": (swapped, r"line 6: offset \d+ comes after \d+ \(out of order, or overlapping"),
        "overlapping": (lines + lines[:1], rf"line {len(lines) + 1}: offset \d+ comes after \d+"),
        "out of range": (lines + [f"{size + 10}:999:Far"], rf"offset {size + 10} is outside the dump's {size} bytes"),
        "not a stream start": (
            [f"{int(x.split(':')[0]) + (7 if i >= 5 else 0)}:{x.split(':', 1)[1]}" for i, x in enumerate(lines)],
            r"a bz2 stream starts at byte \d+, where the index names none",
        ),
        "not an index": (["hello world"], r"line 1: b'hello world' is not offset:page_id:title"),
        "empty": ([], "the index lists no page"),
    }
    for name, (new_lines, message) in cases.items():
        write_index(files, new_lines)
        with pytest.raises(UserError, match=message):
            extract(files, tmp_path, expected_sha1=sha1)
        assert name
    files.index.write_bytes(b"not bz2 at all")
    with pytest.raises(UserError, match="not a whole bz2 file"):
        extract(files, tmp_path, expected_sha1=sha1)


def test_not_a_mediawiki_export(tmp_path):
    files = write_dump([SamplePage(1, "A", "text")], tmp_path / "d", header="<html><body>\n")
    with pytest.raises(UserError, match="not a MediaWiki XML export"):
        extract(files, tmp_path)


def test_entity_expansion_bomb_is_refused_not_expanded(tmp_path):
    bomb = '<?xml version="1.0"?>\n<!DOCTYPE mediawiki [\n<!ENTITY a "aaaaaaaaaa">\n'
    bomb += "".join(f'<!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">\n' for i in range(8)) + "]>\n"
    header = bomb + header_xml().replace("<sitename>Wikipedia", "<sitename>&i;")
    files = write_dump([SamplePage(1, "A", "text")], tmp_path / "d", header=header)
    with pytest.raises(UserError, match=r"declares a DTD or entities .* entity-expansion bomb"):
        extract(files, tmp_path)
    with pytest.raises(UserError, match="not well-formed XML"):  # an entity in a page stream: undefined, not expanded
        parse_pages(b"<page><title>&i;</title></page>", "stream")


def test_a_page_of_100_mb_is_refused(tmp_path):
    files = write_dump([SamplePage(1, "Big", "a" * (100 << 20))], tmp_path / "d")  # runs: bz2 makes it fast
    with pytest.raises(UserError, match=r"page 'Big' holds 104857600 bytes of wikitext, more than the 8 MiB"):
        extract(files, tmp_path)


def test_a_stream_past_its_bound_is_refused(dump, tmp_path, monkeypatch):
    monkeypatch.setattr(streams, "MAX_STREAM_BYTES", 1000)
    with pytest.raises(UserError, match=r"decompresses to more than 0 MiB"):
        extract(dump, tmp_path)


def test_invalid_utf8(tmp_path):
    page = "<page><title>A</title><ns>0</ns><id>1</id><revision><text>caf\xe9</text></revision></page>"
    folder = tmp_path / "d"
    files = write_dump([SamplePage(1, "A", "placeholder")], folder)
    data = files.dump.read_bytes()
    lines = index_lines(files)
    start = int(lines[0].split(":")[0])
    bad = bz2.compress(page.encode("latin-1"))
    footer_at = data.rfind(b"BZh", start + 1)
    new = data[:start] + bad + data[footer_at:]
    files.dump.write_bytes(new)
    with pytest.raises(UserError, match=r"invalid UTF-8 at byte \d+ .*b'\\xe9</t'"):
        extract(files, tmp_path, expected_sha1=_sha1(files.dump))


def test_a_dump_with_no_article(tmp_path):
    pages = [SamplePage(1, "Talk:A", "chat", ns=1), SamplePage(2, "B", "#REDIRECT [[A]]", redirect="A")]
    files = write_dump(pages + [SamplePage(3, "C", "{{only a template}}")], tmp_path / "d")
    with pytest.raises(UserError, match=r"holds no article \(3 pages: .*'redirect': 1, 'namespace': 1, 'empty': 1"):
        extract(files, tmp_path)


def _split(line: str) -> tuple[int, str, str]:
    offset, rest = line.split(":", 1)
    return int(offset), "", rest


def _sha1(path: Path) -> str:
    import hashlib

    return hashlib.sha1(path.read_bytes()).hexdigest()
