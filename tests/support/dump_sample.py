"""A real multistream dump built from plain text: Wikimedia's file layout (the dump, its index, its sha1sums) with
the pages wrapped in MediaWiki XML and the article text in real markup (infoboxes, references, tables, links,
files, categories, interlanguage links), beside redirects and pages of other namespaces. For the tests and
``bench/make_dump.py`` (the one module of tests/ that bench/ imports); :func:`marked_up` keeps every word of the
text it wraps, so what the extraction must give back is known.
"""

from __future__ import annotations

import bz2
import hashlib
import random
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from tasks.corpora.dump.names import DUMP_SUFFIX, INDEX_SUFFIX

NAMESPACES = {-2: "Media", -1: "Special", 0: "", 1: "Talk", 2: "User", 4: "Wikipedia", 6: "File", 10: "Template",
              14: "Category"}  # fmt: skip
HEADER = """<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/" version="0.11" xml:lang="{lang}">
  <siteinfo>
    <sitename>Wikipedia</sitename>
    <dbname>{wiki}</dbname>
    <base>https://{lang}.wikipedia.org/wiki/Main_Page</base>
    <generator>MediaWiki 1.45.0-wmf.1</generator>
    <case>first-letter</case>
    <namespaces>
{namespaces}
    </namespaces>
  </siteinfo>
"""
FOOTER = "</mediawiki>\n"


@dataclass(frozen=True)
class SamplePage:
    page_id: int
    title: str
    wikitext: str
    ns: int = 0
    redirect: str | None = None


@dataclass(frozen=True)
class DumpFiles:
    """The three files of a dump in one folder (Wikimedia's names), and its sha1."""

    dump: Path
    index: Path
    sha1sums: Path
    sha1: str


def articles(text: str) -> list[tuple[str, str]]:
    """``(title, body)`` of each `` = Title = `` article of a wikitext-103-shaped text (bodies keep their heading
    lines), ``<unk>`` written as a word."""
    out: list[tuple[str, list[str]]] = []
    for line in text.replace("<unk>", "unk").split("\n"):
        m = re.fullmatch(r" = ([^=].*?) = ", line)
        if m:
            out.append((m.group(1), []))
        elif out and line.strip():
            out[-1][1].append(line.strip())
    return [(title, "\n".join(lines)) for title, lines in out if lines]


def marked_up(title: str, body: str, rng: random.Random) -> str:
    """``body`` (paragraph and `` = = H = = `` lines) as an article's wikitext: its words kept, markup around them."""
    words = title.split()
    out = [
        "{{Short description|" + title + "}}",
        "{{Infobox thing\n| name = " + title + "\n| image = " + words[0] + ".jpg\n| caption = {{lang|en|x}}\n}}",
    ]
    first = True
    for line in body.split("\n"):
        m = re.fullmatch(r"((?:= )+)(.*?)((?: =)+)", line)
        if m:
            level = m.group(1).count("=")
            out.append("=" * level + " " + m.group(2) + " " + "=" * level)
            if rng.random() < 0.3:
                out.append('{| class="wikitable"\n|-\n! Year !! Value\n|-\n| 1999 || 12\n|-\n| 2001 || 14\n|}')
            continue
        tokens = line.split(" ")
        for i, token in enumerate(tokens):
            roll = rng.random()
            if first and i == 0:
                tokens[i] = "'''" + token + "'''"
            elif not token.isalpha():
                continue
            elif roll < 0.06:
                tokens[i] = f"[[{token}]]"
            elif roll < 0.10:
                tokens[i] = f"[[{token.capitalize()} (disambiguation)|{token}]]"
            elif roll < 0.12:
                tokens[i] = f"''{token}''"
            elif roll < 0.14:
                tokens[i] = token + '<ref name="r' + str(i) + '">{{cite web |url=https://example.org/' + token
                tokens[i] += " |title=" + token + " |access-date=2026-01-01}}</ref>"
            elif roll < 0.15:
                tokens[i] = token + "<ref>Smith, J. (2001). ''A book''. p. 4.</ref>"
            elif roll < 0.16:
                tokens[i] = token + "{{citation needed|date=May 2026}}"
        first = False
        out.append(" ".join(tokens))
        if rng.random() < 0.1:
            out.append(f"[[File:{words[0]} {len(out)}.jpg|thumb|left|A [[picture]] of {{{{lang|la|{title}}}}}]]")
        if rng.random() < 0.1:
            out.append("<!-- an editor's note, not text -->")
    out += ["== References ==", "{{Reflist}}", "", f"[[Category:{words[-1]}s]]", f"[[Category:{title}| ]]",
            f"[[de:{title}]]", f"[[ja:{title}]]", "{{Authority control}}"]  # fmt: skip
    return "\n".join(out)


def sample_pages(text: str, seed: int = 0, repeat: int = 1) -> Iterator[SamplePage]:
    """Pages from ``text``'s articles (``repeat`` times, renumbered): each article, and among them redirects, talk,
    user, template and category pages, a disambiguation page and articles in Japanese, Russian and Arabic."""
    rng = random.Random(seed)
    page_id = 10
    extras = [
        (1, "Talk:{t}", "== Merge? ==\nI think this should be merged. ~~~~"),
        (2, "User:Editor{n}", "I edit [[{t}]]."),
        (10, "Template:Infobox {n}", "{{{{{{1}}}}}}<noinclude>[[Category:Templates]]</noinclude>"),
        (14, "Category:{t}", "Pages about [[{t}]]."),
    ]
    scripts = [
        ("東京の歴史", "東京は日本の首都である。[[江戸|江戸時代]]には将軍の町だった。<ref>出典</ref>\n"
         "== 地理 ==\n東京湾に面している。"),
        ("Москва", "'''Москва''' — столица [[Россия|России]].{{sfn|Иванов|2001}}\n== История ==\n"
         "Город основан в 1147 году."),
        ("القاهرة", "'''القاهرة''' هي عاصمة [[مصر]].\n== التاريخ ==\nتأسست المدينة عام 969."),
    ]  # fmt: skip
    for copy in range(repeat):
        for n, (title, body) in enumerate(articles(text)):
            shown = title if copy == 0 else f"{title} ({copy})"
            page_id += 1
            yield SamplePage(page_id, shown, marked_up(shown, body, rng))
            if n % 7 == 3:
                page_id += 1
                yield SamplePage(page_id, shown.upper(), f"#REDIRECT [[{shown}]]", redirect=shown)
            if n % 5 == 1:
                ns, name, wikitext = extras[n % len(extras)]
                page_id += 1
                yield SamplePage(page_id, name.format(t=shown, n=page_id), wikitext.format(t=shown), ns=ns)
            if n == 2:
                page_id += 1
                yield SamplePage(
                    page_id,
                    f"{shown.split()[0]} (disambiguation)",
                    f"'''{shown.split()[0]}''' may refer to:\n* [[{shown}]], an article\n{{{{disambiguation}}}}",
                )
        for title, wikitext in scripts:
            page_id += 1
            yield SamplePage(page_id, title if copy == 0 else f"{title} ({copy})", wikitext)


def page_xml(page: SamplePage) -> str:
    redirect = f"    <redirect title={quoteattr(page.redirect)} />\n" if page.redirect else ""
    sha = hashlib.sha1(page.wikitext.encode("utf-8")).hexdigest()
    return (
        f"  <page>\n    <title>{escape(page.title)}</title>\n    <ns>{page.ns}</ns>\n    <id>{page.page_id}</id>\n"
        f"{redirect}    <revision>\n      <id>{page.page_id * 10}</id>\n"
        f"      <timestamp>2026-11-01T00:00:00Z</timestamp>\n"
        f"      <contributor>\n        <username>Editor</username>\n        <id>7</id>\n      </contributor>\n"
        f"      <model>wikitext</model>\n      <format>text/x-wiki</format>\n"
        f'      <text bytes="{len(page.wikitext.encode("utf-8"))}" xml:space="preserve">{escape(page.wikitext)}'
        f"</text>\n      <sha1>{sha}</sha1>\n    </revision>\n  </page>\n"
    )


def header_xml(wiki: str = "testwiki", lang: str = "en") -> str:
    spaces = "\n".join(
        f'      <namespace key="{k}" case="first-letter">{escape(v)}</namespace>'
        if v
        else f'      <namespace key="{k}" case="first-letter" />'
        for k, v in NAMESPACES.items()
    )
    return HEADER.format(wiki=wiki, lang=lang, namespaces=spaces)


def write_dump(
    pages: Iterable[SamplePage],
    folder: Path,
    wiki: str = "testwiki",
    date: str = "20261101",
    pages_per_stream: int = 100,
    header: str | None = None,
) -> DumpFiles:
    """The dump of ``pages`` in ``folder`` as Wikimedia lays it out: a header stream, one bz2 stream per
    ``pages_per_stream`` pages, a footer stream; the index; the sha1sums file."""
    folder.mkdir(parents=True, exist_ok=True)
    dump = folder / f"{wiki}-{date}{DUMP_SUFFIX}"
    index = folder / f"{wiki}-{date}{INDEX_SUFFIX}"
    lines: list[str] = []
    digest = hashlib.sha1(usedforsecurity=False)
    with open(dump, "wb") as f:

        def stream(xml: str) -> int:
            at = f.tell()
            data = bz2.compress(xml.encode("utf-8"), 9)
            f.write(data)
            digest.update(data)
            return at

        stream(header if header is not None else header_xml(wiki))
        batch: list[SamplePage] = []

        def flush() -> None:
            at = stream("".join(page_xml(p) for p in batch))
            lines.extend(f"{at}:{p.page_id}:{p.title}" for p in batch)
            batch.clear()

        for page in pages:
            batch.append(page)
            if len(batch) == pages_per_stream:
                flush()
        if batch:
            flush()
        stream(FOOTER)
    index.write_bytes(bz2.compress(("\n".join(lines) + "\n").encode("utf-8")))
    sha1 = digest.hexdigest()
    sums = folder / f"{wiki}-{date}-sha1sums.txt"
    index_sha1 = hashlib.sha1(index.read_bytes(), usedforsecurity=False).hexdigest()
    sums.write_text(f"{index_sha1}  {index.name}\n{sha1}  {dump.name}\n")
    return DumpFiles(dump, index, sums, sha1)
