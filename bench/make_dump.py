"""A Wikimedia multistream dump of any size from real-shaped pages: ../shared/data's articles in real markup
(infoboxes, references, tables, links, files, categories, interlanguage links) beside redirects, other namespaces
and non-Latin articles, repeated (renumbered) until the dump reaches ``--mb`` megabytes of bz2.

    .venv/bin/python -m bench.make_dump --mb 60 --out bench/out/dump   [--pages-per-stream 100]

Writes ``<wiki>-<date>-pages-articles-multistream.xml.bz2``, its index and its sha1sums file (Wikimedia's layout).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def main(argv: list[str] | None = None) -> int:
    from tests.support.dump_sample import sample_pages, write_dump

    p = argparse.ArgumentParser(prog="python -m bench.make_dump", description=__doc__)
    p.add_argument("--mb", type=float, default=60.0, help="the dump's size in MB of bz2 (approximately, from above)")
    p.add_argument("--out", type=Path, default=Path("bench/out/dump"))
    p.add_argument("--pages-per-stream", type=int, default=100)
    args = p.parse_args(argv)
    if args.mb <= 0 or args.pages_per_stream < 1:
        print("error: --mb must be > 0 and --pages-per-stream >= 1", file=sys.stderr)
        return 2
    text = (DATA / "wikitext2-valid.txt").read_text(encoding="utf-8")
    one = sum(len(p.wikitext.encode()) for p in sample_pages(text))  # ~1/4.5 of it in bz2
    copies = max(1, int(args.mb * 1e6 * 4.5 / one) + 1)
    t0 = time.monotonic()
    pages = itertools.chain.from_iterable(sample_pages(text, seed=i, repeat=1) for i in range(copies))
    files = write_dump(_renumbered(pages), args.out, pages_per_stream=args.pages_per_stream)
    size = files.dump.stat().st_size
    print(f"{files.dump} {size / 1e6:.1f} MB, {copies} copies of the sample, {time.monotonic() - t0:.0f} s")
    return 0


def _renumbered(pages):
    from dataclasses import replace

    for page_id, page in enumerate(pages, 1):
        yield replace(page, page_id=page_id)


if __name__ == "__main__":
    sys.exit(main())
