"""``corpus.kind=wikitext``: the wikitext-103-raw-v1 zip (the chapter's corpus). Its splits are the zip's own
three members, handed to the writer as UTF-8 byte streams (inflated in a reader thread, never a Python ``str``),
so ``cat wiki.train.txt wiki.valid.txt wiki.test.txt`` is the chapter's ``wikipedia.txt`` byte for byte. It
names the zip's content (sha256 and size), never its URL (docs/CORPUS.md)."""

from __future__ import annotations

import contextlib
import zipfile
from collections.abc import Iterator

from mygpt.errors import UserError
from tasks.corpora.source import Document, SourceContext
from tasks.corpora.unzip import check_members, member_utf8, open_zip
from tasks.corpora.writer import ZIP_DAMAGED, SplitStream
from tasks.sources.allowed import WIKITEXT_103_URL
from tasks.sources.fetched import fetched_file
from tasks.sources.identity import fetched_identity

DEFAULT_URL = WIKITEXT_103_URL
PINNED_BYTES = 191_984_949  # the chapter's EXPECTED_BYTES for DEFAULT_URL
MEMBERS = {s: f"wikitext-103-raw/wiki.{s}.raw" for s in ("train", "valid", "test")}
LAYOUT_HINT = "source_url must point at the wikitext-103-raw-v1 zip"
DAMAGED_HINT = "; rerun to download it again, or check source_url"


class WikitextSource:
    kind = "wikitext"
    fields = frozenset({"source_url", "expected_bytes", "expected_sha256", "article_index"})
    damaged = ZIP_DAMAGED  # reading a member raised one of these: the zip is damaged
    damaged_hint = DAMAGED_HINT

    def identity(self, settings, ctx: SourceContext) -> dict:
        """The sha256 and size of the zip at ``source_url`` (:func:`tasks.sources.identity.fetched_identity`)."""
        return fetched_identity(settings, ctx.store, ctx.log, ctx.stage)

    def documents(self, settings, ctx) -> Iterator[Document]:
        raise NotImplementedError("the wikitext zip gives its splits as bytes: split_streams")

    @contextlib.contextmanager
    def split_streams(self, settings, ctx):
        """``(streams, raw_total, metrics)``: the zip fetched and checked (members, bombs, layout), each member a
        stream of its UTF-8 bytes; ``metrics`` what the report shows of the zip and its download."""
        shown = settings.shown_url
        with fetched_file(ctx, settings, ctx.stage) as got:
            check_members(got.path, shown, MEMBERS.values())
            with open_zip(got.path, shown) as zf:
                streams = zip_streams(zf, shown)
                metrics = {
                    "source_url": shown,
                    "source_url_sha256": settings.address,  # the address, told apart where the redacted URL cannot
                    "zip_bytes": got.bytes,
                    "zip_sha256": got.sha256,
                    "zip_published": False,
                    "download_seconds": got.seconds,
                    "download": got.facts,
                }
                yield streams, sum(s.raw_bytes for s in streams), metrics


def zip_streams(zf: zipfile.ZipFile, source: str) -> list[SplitStream]:
    """The zip's three members as the writer's split streams; ``UserError`` when one is missing."""
    names = set(zf.namelist())
    for member in MEMBERS.values():
        if member not in names:
            listed = ", ".join(sorted(names)[:8]) or "(no files)"
            raise UserError(f"{source} has no member {member!r} (it has: {listed}); {LAYOUT_HINT}")
    return [
        SplitStream(
            split,
            member_utf8(zf, member, source),
            f"{member} in {source}",
            zf.getinfo(member).file_size,
            {"member": member},
        )
        for split, member in MEMBERS.items()
    ]


SOURCE = WikitextSource()
