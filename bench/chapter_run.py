"""The chapter's full run on this machine: the pipeline's default model (the chapter's 10,000 steps, 2.16 M
parameters) on the 545 MB wikitext-shaped corpus, its loss curve, validation and test bits per byte and wall time,
the table written as it goes (a partial run still tells something).

    flock /tmp/wiki-bench.lock .venv/bin/python -m bench.chapter_run                 # the whole run (about an hour)
    .venv/bin/python -m bench.chapter_run --steps 200 --root bench/out/chapter-200   # a short proof of the script

What it does:

1. the corpus and its zip as ``bench.full_scale`` makes them (``bench/out/wiki545m.txt``, generated once by
   ``bench/make_corpus.py``; ``bench/out/wikitext-103-545m.zip``);
2. the stages corpus, tokenizer, shards, model and evaluate, called plainly (no Prefect server) in the artifact
   root ``--root`` with the flow's defaults, except ``model.steps=--steps`` and the zip as ``corpus.source_url``;
   a stage already published there is reused, and a killed run's model resumes from its checkpoint (rerun with
   the same ``--root`` and ``--steps``);
3. at every print point of the model stage (every 200 steps; validation every 500) a row of the table: step,
   training loss, validation loss and bits per byte, the stage's wall time so far and the chapter's figures
   (its run on an M1, bf16: training loss at steps 1, 1000, 5000 and 10000), rewritten to
   ``--out`` (markdown) and beside it as JSON, each by one rename;
4. at the end, the model's final validation loss and bits per byte, the evaluate stage's test loss and bits per
   byte, the training's tokens/s, each stage's wall time, the whole wall time and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path

from bench.full_scale import DEFAULT_BYTES, OUT, corpus_file, zip_file

#: the chapter's run (section 28.6, M1 MPS, bf16): the training loss it prints at these steps
CHAPTER_LOSS = {1: 176.9465, 1000: 4.8836, 5000: 3.4889, 10000: 3.4841}
STAGES = ("corpus", "tokenizer", "shards", "model", "evaluate")
_POINT = re.compile(r"^step (\d+)/(\d+) loss (\S+)(?: val_loss (\S+))?(?: val_bpb (\S+))?")


class Table:
    """The run's table, rewritten whole (by one rename) at every row: markdown at ``path``, JSON beside it."""

    def __init__(self, path: Path, head: dict) -> None:
        self.path, self.head, self.rows, self.end = path, head, [], {}

    def add(self, row: dict) -> None:
        self.rows.append(row)
        self.write()

    def write(self) -> None:
        from mygpt.atomic import atomic_write_text

        lines = [f"# The chapter's run: {self.head['steps']:,} steps on {self.head['corpus']}", ""]
        lines += [f"- {k}: {v}" for k, v in self.head.items()]
        lines += ["", "| step | train loss | val loss | val bits/byte | model stage s | chapter's train loss |"]
        lines += ["|---:|---:|---:|---:|---:|---:|"]
        for r in self.rows:
            chapter = CHAPTER_LOSS.get(r["step"])
            lines.append(
                f"| {r['step']:,} | {r['loss']:.4f} | {_num(r.get('val_loss'))} | {_num(r.get('val_bpb'))} | "
                f"{r['seconds']:.0f} | {_num(chapter)} |"
            )
        if self.end:
            lines += ["", *[f"- {k}: {v}" for k, v in self.end.items()]]
        atomic_write_text(self.path, "\n".join(lines) + "\n")
        atomic_write_text(
            self.path.with_suffix(".json"), json.dumps({**self.head, "rows": self.rows, "end": self.end}, indent=1)
        )


def _num(x) -> str:
    return "" if x is None else f"{x:.4f}"


def main(argv: list[str] | None = None) -> int:
    from tasks.model import CHAPTER_RUN

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=CHAPTER_RUN["steps"])
    ap.add_argument("--bytes", type=int, default=DEFAULT_BYTES, help="the generated corpus's size")
    ap.add_argument("--root", type=Path, default=OUT / "chapter-run-art", help="the artifact root (kept)")
    ap.add_argument("--out", type=Path, default=None, help="the table (default bench/out/chapter_run-STEPS.md)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (run.threads; 0: torch's default)")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be at least 1")
    out = args.out or OUT / f"chapter_run-{args.steps}.md"
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

    from flows.settings import Pipeline
    from tasks.core.stage import BuildContext
    from tasks.registry import BY_NAME

    zpath = zip_file(corpus_file(args.bytes))
    load_before = os.getloadavg()
    settings = Pipeline.parse(
        corpus={"source_url": zpath.resolve().as_uri()},
        model={"steps": args.steps},
        run={"artifacts_dir": str(args.root.resolve()), "threads": args.threads},
    )
    model = settings.resolved("model")
    table = Table(
        out,
        {
            "corpus": zpath.name,
            "steps": args.steps,
            "model": f"embed {model.embed_dim}, {model.num_layers} layers, {model.num_heads} heads "
            f"({model.num_kv_heads} kv), seq_len {model.seq_len}, batch {model.batch_size}, {model.norm}, "
            f"{model.position}, lr {model.lr} {model.schedule} (warmup {model.warmup})",
            "device": f"{model.device} / {model.precision}, {os.cpu_count()} CPUs, threads {args.threads or 'default'}",
            "root": str(args.root),
            "load average before (1 min)": f"{load_before[0]:.2f}",
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        },
    )
    started: dict[str, float] = {}
    report = BuildContext.progress

    def progress(self, done, total, message="", force=False):
        if self.stage == "model":
            started.setdefault("model", time.perf_counter())
            m = _POINT.match(message)
            if m and int(m.group(1)) and (not table.rows or table.rows[-1]["step"] != int(m.group(1))):
                row = {"step": int(m.group(1)), "loss": float(m.group(3))}
                for key, group in (("val_loss", 4), ("val_bpb", 5)):
                    if m.group(group):
                        row[key] = float(m.group(group))
                table.add({**row, "seconds": round(time.perf_counter() - started["model"], 1)})
        return report(self, done, total, message, force)

    BuildContext.progress = progress  # type: ignore[method-assign]
    t0 = time.perf_counter()
    refs: dict = {}
    seconds: dict[str, float] = {}
    for name in STAGES:
        stage = BY_NAME[name]
        t = time.perf_counter()
        refs[name] = stage.task.fn(*(refs[i] for i in stage.inputs), settings.resolved(name), settings.run)
        seconds[name] = round(time.perf_counter() - t, 1)
        print(f"{name}: {refs[name]['version']} in {seconds[name]:.1f} s", flush=True)
    wall = time.perf_counter() - t0

    from tasks.registry import open_store

    store = open_store(str(args.root.resolve()))
    m = store.get("model", refs["model"]["version"]).manifest["metrics"]
    e = store.get("evaluate", refs["evaluate"]["version"]).manifest["metrics"]
    load_after = os.getloadavg()
    table.end = {
        "final val loss / bits per byte": f"{_num(m.get('final_val_loss'))} / {_num(m.get('final_val_bpb'))}",
        "test loss / bits per byte (evaluate)": f"{_num(e.get('test_loss'))} / {_num(e.get('test_bpb'))}",
        "params": f"{m['params']:,}",
        "train tokens": f"{m['train_tokens']:,}",
        "resumed from step": m.get("resumed_from"),
        "training: seconds / tokens/s": f"{m.get('train_seconds')} / {m.get('tokens_per_sec')}",
        "stage seconds (this call; 0-ish = reused)": ", ".join(f"{k} {v}" for k, v in seconds.items()),
        "wall time (this call)": f"{wall:.0f} s",
        "load average after (1 min)": f"{load_after[0]:.2f}",
    }
    table.write()
    print(out.read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
