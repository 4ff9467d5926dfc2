"""``python -m tasks.corpora.dump URL --work DIR --out FILE``: a dump's documents as one text file, each article
a `` = Title = `` line and its text, on local worker processes, resumable from ``--work`` (the adapter alone, without
the corpus stage: for the benchmark and for looking at what an extraction keeps)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from types import SimpleNamespace

from mygpt.errors import UserError


def main(argv: list[str] | None = None) -> int:
    from tasks.core.settings import RunOptions
    from tasks.corpora.dump.adapter import DumpSource
    from tasks.corpora.dump.settings import DumpSettings

    p = argparse.ArgumentParser(prog="python -m tasks.corpora.dump", description=__doc__)
    p.add_argument("url", help="the URL of <wiki>-<date>-pages-articles-multistream.xml.bz2 (http(s):// or file://)")
    p.add_argument("--work", type=Path, required=True, help="downloads and per-range checkpoints (kept to resume)")
    p.add_argument("--out", type=Path, required=True, help="the text file to write (atomically)")
    p.add_argument("--workers", type=int, default=1, help="local worker processes")
    p.add_argument("--streams-per-range", type=int, default=None, help="bz2 streams per task and checkpoint")
    p.add_argument("--expected-sha1", default=None, help="the dump's sha1, when no sha1sums.txt is beside it")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    log = logging.getLogger("dump")
    try:
        settings = DumpSettings(source_url=args.url, expected_sha1=args.expected_sha1)
        source = DumpSource(args.streams_per_range) if args.streams_per_range else DumpSource()
        args.work.mkdir(parents=True, exist_ok=True)
        ctx = SimpleNamespace(
            work=args.work,
            run=RunOptions(workers=args.workers),
            log=log,
            source=None,
            progress=lambda done, total, message="": log.info("%5.1f%% %s", 100 * done / max(total, 1), message),
        )
        tmp = args.out.with_name(args.out.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for doc in source.documents(settings, ctx):
                f.write(f" = {doc.title} = \n\n{doc.text}\n")
        os.replace(tmp, args.out)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(source.report_metrics(settings, ctx)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
