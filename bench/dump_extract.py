"""Our dump extraction beside wikiextractor's on the same dump with the same cores: wall time, pages/s, input MB/s
of bz2, peak RSS (the whole process tree, sampled), and the markup each leaves in its text.

    flock /tmp/wiki-bench.lock .venv/bin/python -m bench.dump_extract DUMP.xml.bz2 [--cores 2] [--rounds 1]

DUMP: a ``<wiki>-<date>-pages-articles-multistream.xml.bz2`` with its index and sha1sums beside it (e.g. from
``bench.make_dump``). Ours: ``python -m tasks.corpora.dump`` with ``--cores`` local workers, from a fresh work
folder. wikiextractor (PyPI ``wikiextractor``, a reference, not a dependency): ``--processes CORES --no-templates``
(its faster mode: template expansion off, as ours drops templates). The runs alternate, ours first, ``--rounds``
times; the load average is printed before and after each.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

#: markup that plain text should not hold: what each pattern counts in an output
MARKUP = {
    "{{ or }}": r"\{\{|\}\}",
    "[[ or ]]": r"\[\[|\]\]",
    "<ref": r"<ref\b",
    "table {| |} ||": r"\{\||\|\}|\|\|",
    "'' quotes": r"''",
    "Category:/File:": r"\b(?:Category|File|Image):",
    "<!-- -->": r"<!--|-->",
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.dump_extract", description=__doc__)
    p.add_argument("dump", type=Path)
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument(
        "--streams-per-range",
        type=int,
        default=None,
        help="ours: bz2 streams per worker task (default: the adapter's, streams.range_size)",
    )
    p.add_argument(
        "--only", choices=("ours", "wikiextractor"), default=None, help="run one of the two (a scale run of ours)"
    )
    args = p.parse_args(argv)
    if not args.dump.is_file() or args.cores < 1 or args.rounds < 1:
        print("error: DUMP must be a file, --cores and --rounds at least 1", file=sys.stderr)
        return 2
    dump = args.dump.resolve()
    size = dump.stat().st_size
    pages = _pages_in_index(dump)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")])}
    rows = []
    for round_ in range(args.rounds):
        for name in (args.only,) if args.only else ("ours", "wikiextractor"):
            with tempfile.TemporaryDirectory(prefix=f"dump-bench-{name}-") as tmp:
                out = Path(tmp) / "out"
                if name == "ours":
                    cmd = [sys.executable, "-m", "tasks.corpora.dump", dump.as_uri(), "--work", f"{tmp}/work",
                           "--out", str(out), "--workers", str(args.cores)]  # fmt: skip
                    if args.streams_per_range:
                        cmd += ["--streams-per-range", str(args.streams_per_range)]
                else:
                    cmd = [sys.executable, "-m", "wikiextractor.WikiExtractor", str(dump), "-o", str(out),
                           "--processes", str(args.cores), "--no-templates", "-q"]  # fmt: skip
                load0 = _load()
                wall, rss = _run(cmd, env)
                load1 = _load()
                text = _text_of(out)
                rows.append((round_, name, wall, rss, load0, load1, text))
    print(f"dump: {dump.name}, {size / 1e6:.1f} MB bz2, {pages} pages in the index, {args.cores} cores")
    print("| run | wall s | pages/s | input MB/s | peak RSS MB | output MB | load before -> after |")
    print("|---|---|---|---|---|---|---|")
    for round_, name, wall, rss, load0, load1, text in rows:
        print(
            f"| {name} #{round_ + 1} | {wall:.1f} | {pages / wall:.0f} | {size / 1e6 / wall:.2f} | {rss / 1e6:.0f} "
            f"| {len(text.encode()) / 1e6:.1f} | {load0} -> {load1} |"
        )
    print("\nmarkup left, per MB of output (last round):")
    last = {name: text for _, name, *_, text in rows}
    print("| pattern | " + " | ".join(last) + " |")
    print("|---|" + "---|" * len(last))
    for label, pattern in MARKUP.items():
        cells = [f"{len(re.findall(pattern, t)) / max(len(t.encode()) / 1e6, 1e-9):.1f}" for t in last.values()]
        print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


def _pages_in_index(dump: Path) -> int:
    import bz2

    index = dump.with_name(dump.name.replace(".xml.bz2", "-index.txt.bz2"))
    with bz2.open(index, "rb") as f:
        return sum(1 for _ in f)


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _run(cmd: list[str], env: dict) -> tuple[float, int]:
    """Wall seconds and the peak RSS of the process tree (sampled every 0.1 s)."""
    import psutil

    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = [0]

    def sample() -> None:
        try:
            root = psutil.Process(proc.pid)
            while proc.poll() is None:
                total = 0
                for p in [root, *root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        total += p.memory_info().rss
                peak[0] = max(peak[0], total)
                time.sleep(0.1)
        except psutil.Error:
            pass

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    _, err = proc.communicate()
    wall = time.monotonic() - t0
    watcher.join()
    if proc.returncode:
        sys.stderr.write(err.decode(errors="replace")[-2000:])
        raise SystemExit(f"error: {cmd[2]} exited {proc.returncode}")
    return wall, peak[0]


def _text_of(out: Path) -> str:
    if out.is_file():
        return out.read_text(encoding="utf-8")
    parts = [p.read_text(encoding="utf-8") for p in sorted(out.rglob("wiki_*"))]
    shutil.rmtree(out, ignore_errors=True)
    return re.sub(r"</?doc[^>]*>", "", "".join(parts))


if __name__ == "__main__":
    sys.exit(main())
