"""``wiki-pipeline``: run the flow, serve its deployment, list the artifacts.

    wiki-pipeline run [--tiny] [--mirror] [--param K=V ...] [--force STAGE ...] [--only STAGE]
    wiki-pipeline serve [--tiny] [--param K=V ...]     the deployment runner for wiki-pipeline/wiki-pipeline
    wiki-pipeline artifacts [--stage S] [--json]       versions, sizes and lineage in the artifact store (stale marked)
    wiki-pipeline gc [--stale] [--yes]                 what no run needs (unfinished builds, ...): listed; --yes deletes
    wiki-pipeline params [--tiny] [--param K=V ...]    the flow parameters as JSON (for prefect deployment run --params)

``--param KEY=VALUE`` takes a flat key (``steps=100``: the field of whichever stage has it; ``seed``, ``device``
and ``precision`` set the model's and the samples'), a dotted one (``samples.seed=7``) or a whole stage
(``model={"steps": 100}``); see ``flows.settings``. VALUE is read as JSON when it parses (``steps=100``,
``force=["tokenizer"]``), else as a string (``prompt=The history of``). Bad input a user can fix ends with
``error: ...`` on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys

from flows.prefect_api import unauthorized
from flows.run_commands import DEPLOYMENT, cmd_params, cmd_run, cmd_serve
from flows.store_commands import cmd_artifacts, cmd_gc, cmd_pull
from mygpt.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="wiki-pipeline", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)

    def add_params(p, serve=False):
        p.add_argument("--tiny", action="store_true", help="the tiny preset (flows/settings.py TINY)")
        p.add_argument(
            "--param",
            "-p",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="a flow parameter (repeatable); VALUE is JSON or a plain string",
        )
        p.add_argument("--params", metavar="JSON", help="a JSON object of flow parameters (--param wins)")
        p.add_argument("--artifacts-dir", help="artifact root (default: artifacts/ or $WIKI_PIPELINE_ARTIFACTS)")
        p.add_argument("--source-url", help="where to download the wikitext-103-raw-v1 zip from")

    run = sub.add_parser("run", help="run the flow in this process")
    add_params(run)
    run.add_argument(
        "--mirror",
        action="store_true",
        help="serve ../shared/data as a wikitext-103-style zip on 127.0.0.1 for this run (no internet)",
    )
    run.add_argument("--force", action="append", metavar="STAGE", help="rebuild STAGE (and so everything after it)")
    run.add_argument("--only", metavar="STAGE", help="run only STAGE, against the latest upstream versions")
    run.add_argument("--full-check", action="store_true", help="verify every reused file's sha256")
    run.set_defaults(func=cmd_run)

    serve = sub.add_parser("serve", help=f"serve the deployment wiki-pipeline/{DEPLOYMENT} (runs until Ctrl-C)")
    add_params(serve)
    serve.add_argument("--limit", type=int, default=1, help="flow runs at a time (default 1)")
    serve.set_defaults(func=cmd_serve)

    params = sub.add_parser("params", help="print the chosen parameters as JSON")
    add_params(params)
    params.set_defaults(func=cmd_params)

    art = sub.add_parser("artifacts", help="list published versions, sizes and lineage")
    art.add_argument("--artifacts-dir", help="artifact root (default: artifacts/ or $WIKI_PIPELINE_ARTIFACTS)")
    art.add_argument("--stage", help="only this stage (its name: corpus, tokenizer, ...; see tasks/registry.py)")
    art.add_argument("--json", action="store_true")
    art.set_defaults(func=cmd_artifacts)

    gc = sub.add_parser(
        "gc", help="list what no run needs (unfinished builds, leftovers): what, how big, why; --yes deletes it"
    )
    gc.add_argument("--artifacts-dir", help="artifact root (default: artifacts/ or $WIKI_PIPELINE_ARTIFACTS)")
    gc.add_argument(
        "--stale",
        action="store_true",
        help="also the published versions no run can reuse (marked stale by `wiki-pipeline artifacts`)",
    )
    gc.add_argument("--yes", action="store_true", help="delete them (default: only list them)")
    gc.set_defaults(func=cmd_gc)

    pull = sub.add_parser(
        "pull", help="copy a published version (e.g. export/<version>) into a local directory, checked file by file"
    )
    pull.add_argument("version", metavar="STAGE/VERSION", help="as `wiki-pipeline artifacts` lists it")
    pull.add_argument("dest", metavar="DIR", help="a new (or empty) directory to copy it into")
    pull.add_argument("--artifacts-dir", help="artifact root (default: artifacts/ or $WIKI_PIPELINE_ARTIFACTS)")
    pull.set_defaults(func=cmd_pull)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "artifacts_dir", None) is not None and not args.artifacts_dir.strip():
            raise UserError(  # every command alike: not the working directory here, the default root there
                "--artifacts-dir is empty; give a directory or s3://bucket/prefix, or leave the option out for the "
                "default ($WIKI_PIPELINE_ARTIFACTS, else artifacts/ in the checkout)"
            )
        return args.func(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        refused = unauthorized(e)
        if refused is None:
            raise
        print(f"error: {refused}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to resume (finished stages are reused)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
