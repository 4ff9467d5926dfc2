"""Wikitext to plain text: each construct dropped or kept as docs/CORPUS.md says, and real articles wrapped in real
markup come back word for word."""

from __future__ import annotations

import random

import pytest

from tasks.corpora.dump import wikitext_tokens
from tasks.corpora.dump.wikitext import SiteNames, plain_text
from tests.support.dump_sample import articles, marked_up, sample_pages

from .conftest import sample_text


@pytest.mark.parametrize(
    ("wikitext", "expected"),
    [
        ("A {{Infobox x|name=y|a={{nested|b}}}} b", "A b"),
        ('A<ref>cite {{cite web|url=x}}</ref> b<ref name=n/> c<ref name="a/b">z</ref>.', "A b c."),
        ("[[Paris]] and [[Lyon|the city of Lyon]]", "Paris and the city of Lyon"),
        ("x [[File:a.jpg|thumb|A [[cap]]]] [[Image:b.png]] [[Media:c.ogg]] y", "x y"),
        ("text\n[[Category:Cats]]\n[[Category:Dogs| ]]", "text"),
        ("text [[de:Text]] [[zh-yue:文字]] [[ja:テキスト]]", "text"),
        ("see [[:Category:Cats|the cats]] and [[wikt:word|word]]", "see the cats and word"),
        ("'''Bold''' and ''italic'' and '''''both'''''", "Bold and italic and both"),
        ("a <!-- hidden --> b __NOTOC__ c", "a b c"),
        ("[https://example.org a label] [https://bare.example] https://plain.example", "a label https://plain.example"),
        ("x &amp; y&nbsp;z &lt;tag&gt;", "x & y z <tag>"),
        ("a\n{| class=wikitable\n|-\n| 1 || 2\n|}\nb", "a\n\nb"),
        ("* one\n* two [[three]]", "one\n\ntwo three"),
        ("<math>x^2</math> <gallery>\nA.jpg|cap\n</gallery> <small>kept</small> <sub>2</sub>", "kept 2"),
        ("# first\n# second\n; term\n: definition", "first\n\nsecond\n\nterm\n\ndefinition"),
        ("{{only a template}}\n[[Category:X]]", ""),
        ("東京は[[日本|日本国]]の首都。<ref>出典</ref>", "東京は日本国の首都。"),
    ],
)
@pytest.mark.parametrize("fast", [True, False])
def test_constructs(wikitext, expected, fast):
    assert plain_text(wikitext, fast=fast) == (expected + "\n" if expected else "")


def test_headings_are_wikitext103_lines_and_empty_sections_go():
    text = "Intro.\n== A [[b|B]] ==\nBody.\n== Empty ==\n=== Also empty ===\n== C ==\n=== D ===\nDeep.\n== R ==\n{{x}}"
    assert plain_text(text) == "Intro.\n\n = = A B = = \n\nBody.\n\n = = C = = \n\n = = = D = = = \n\nDeep.\n"


def test_localised_namespaces_from_the_site():
    site = SiteNames.of({6: "Datei", 14: "Kategorie", 4: "Wikipedia"})
    assert plain_text("a [[Datei:x.jpg|mini|Bild]] [[Kategorie:Y]] [[File:z.png]] b", site) == "a b\n"
    assert plain_text("a [[Wikipedia:Hilfe|Hilfe]] b", site) == "a Hilfe b\n"  # a namespace, not a language


def test_real_articles_in_real_markup_come_back_word_for_word():
    rng = random.Random(3)
    pairs = articles(sample_text(6))
    assert len(pairs) == 6
    for title, body in pairs:
        wikitext = marked_up(title, body, rng)
        assert "{{" in wikitext and "<ref" in wikitext and "[[Category:" in wikitext
        assert plain_text(wikitext) == "\n\n".join(_with_text_under(body.split("\n"))) + "\n", title


def _with_text_under(lines: list[str]) -> list[str]:
    """The lines, each heading kept only when text follows it before a heading of its level or above (the sample's
    References section, and wikitext-103's sections whose tables it dropped, have none)."""
    level = [line.count("=") // 2 if line.startswith("= ") else 0 for line in lines]
    kept = []
    for i, line in enumerate(lines):
        if not level[i]:
            kept.append(line)
            continue
        for j in range(i + 1, len(lines)):
            if not level[j]:
                kept.append(f" {line} ")
                break
            if level[j] <= level[i]:
                break
    return kept


def test_the_token_walk_equals_the_tree_walk_on_real_shaped_pages():
    pages = [p.wikitext for p in sample_pages(sample_text(30), seed=5)]
    for wikitext in pages:
        wikitext_tokens.walk(wikitext, SiteNames.of({}), [])  # no page of the sample needs the plain way
        assert plain_text(wikitext, fast=True) == plain_text(wikitext, fast=False)


@pytest.mark.parametrize(
    "wikitext",
    [
        "[[{{tpl}}|x]] y",  # markup in a link's target: the plain way
        "<span style={{s}}>kept</span> <div class='a'><div>in</div></div> <ref group=a>r</ref>",
        "[[a|b [[c]] d]] [[a|]] [[#section]] [[x#y|z]]",
        "&#65;&#x42;&eacute;&bogus; {{{arg|default}}} <!-- open",
        "== {{t}} ==\n== [[a|b]] ''c'' ==\ntext\n<nowiki>[[not a link]] {{not}}</nowiki>",
        "<table><tr><td>cell</td></tr></table> <references>\n<ref name=a>x</ref>\n</references> after",
        "{| \n|+ caption\n|-\n! h\n|}\n* [[File:x.png|thumb|{{a|[[b]]}}]] item",
    ],
)
def test_the_token_walk_equals_the_tree_walk_on_edge_cases(wikitext):
    assert plain_text(wikitext, fast=True) == plain_text(wikitext, fast=False)


def test_spaces_are_written_as_replacing_every_run_of_them_writes_them():
    """SPACES leaves a lone space alone: the same text as replacing every run of spaces, tabs and no-break spaces
    by one space, on random strings of those characters beside others."""
    import re

    from tasks.corpora.dump.wikitext_rules import SPACES

    every_run = re.compile(r"[ \t\u00a0]+")
    rnd = random.Random(0)
    for _ in range(5000):
        s = "".join(rnd.choice(" \t\u00a0\u2003a'\n=") for _ in range(rnd.randint(0, 40)))
        assert SPACES.sub(" ", s) == every_run.sub(" ", s), repr(s)
