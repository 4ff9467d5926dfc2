"""``wiki-pipeline run``, ``serve`` and ``params``: the flow in this process, or served as a deployment."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import TYPE_CHECKING, cast

from flows.choices import checked, chosen_groups
from flows.console_errors import user_errors_told_once
from flows.prefect_api import check_prefect_server, prefect_api_url
from mygpt.errors import UserError

if TYPE_CHECKING:
    from prefect.states import State

    from tasks.core.stage import StageRef

DEPLOYMENT = "wiki-pipeline"
POLL_SECONDS = 0.5  # how often `serve`'s runner asks the server for flow runs to start


@contextlib.contextmanager
def loopback_mirror():
    """Serve a wikitext-103-style zip built from ../shared/data on 127.0.0.1 (flows/mirror.py)."""
    from flows.mirror import DEMO_PORT, PORT_VARIABLE, ZIP_NAME, Mirror, build_wikitext_zip, chosen_port

    try:
        port = chosen_port()
    except ValueError as e:
        raise UserError(str(e)) from None
    try:
        data = build_wikitext_zip()
    except OSError as e:
        raise UserError(
            f"--mirror needs ../shared/data/wikitext2-valid.txt (or WIKI_PIPELINE_SHARED_DATA): {e}"
        ) from None
    try:  # a fixed port keeps source_url, and so every version, the same from one run to the next
        mirror = Mirror({"/" + ZIP_NAME: data}, port=port or DEMO_PORT).start()
    except OSError as e:
        if port is not None:  # the user chose it: say so rather than serve elsewhere
            raise UserError(
                f"{PORT_VARIABLE}={port}: that port on 127.0.0.1 cannot be used ({e.strerror}); give a free one"
            ) from None
        mirror = Mirror({"/" + ZIP_NAME: data}).start()
        print(
            f"note: port {DEMO_PORT} is busy; the mirror serves on another port (the versions follow the zip's bytes, "
            f"so they are the same; {PORT_VARIABLE} picks one)",
            file=sys.stderr,
        )
    try:
        print(f"loopback mirror: {mirror.url()} ({len(data):,} bytes)", file=sys.stderr)
        yield mirror.url()
    finally:
        mirror.stop()


def cmd_run(args) -> int:
    from tasks.sources.download import DownloadKnobs

    with contextlib.ExitStack() as stack:
        if args.mirror:  # first: the allow-lists must see the URL this run fetches, the mirror's
            if "source_url" in chosen_groups(args).get("corpus", {}):
                raise UserError("--mirror and source_url both choose the source; give one of them")
            url = stack.enter_context(loopback_mirror())
            args = argparse.Namespace(**{**vars(args), "source_url": url})
        settings = checked(args)  # the run's one parse: the flow takes these settings as they are
        DownloadKnobs.from_env()  # a bad WIKI_PIPELINE_* knob stops the run here, not inside the corpus stage
        check_prefect_server()
        if not prefect_api_url():
            from prefect.settings import PREFECT_HOME

            from flows.server import server_for_this_run

            stack.enter_context(server_for_this_run(PREFECT_HOME.value(), say=lambda m: print(m, file=sys.stderr)))
        from flows.server import watched_runs

        stack.enter_context(watched_runs())  # a killed run shows Crashed, not Running forever
        from flows.settings import carrying
        from flows.wiki_pipeline import wiki_pipeline

        stack.enter_context(user_errors_told_once())  # after the import: Prefect's console handler is there now
        # Prefect's Flow.__call__ overloads take return_state=True as one of the flow's **parameters: the state;
        # the flow takes the settings parsed here as they are (parsed and resolved once per run)
        with carrying(settings):
            state = cast("State[dict[str, StageRef]]", wiki_pipeline(**dict(settings), return_state=True))
        if not state.is_completed():
            try:
                state.result()  # re-raises the flow's exception (a UserError becomes exit code 2)
            except UserError:
                raise
            except Exception as e:
                print(f"error: the flow run ended {state.name}: {type(e).__name__}: {e}", file=sys.stderr)
                return 1
            return 1
        refs = state.result()
    for stage, ref in refs.items():
        print(f"{stage:10s} {ref['path']}")
    samples = refs.get("samples")
    if samples:
        print()
        from tasks.core.stage import ref_dir

        print((ref_dir(samples) / "samples.md").read_text(encoding="utf-8"))
    return 0


def flow_parameters(settings) -> dict:
    """``settings`` (a checked ``Pipeline``) as the flow's JSON parameters, credentials in ``source_url``
    included: this is what a deployment runs with (everywhere else the JSON form of the settings is redacted)."""
    from tasks.core.urls import credentials_revealed

    with credentials_revealed():
        return settings.flow_parameters()


def cmd_serve(args) -> int:
    import asyncio

    from prefect.exceptions import TerminationSignal
    from prefect.runner import Runner
    from prefect.settings import PREFECT_UI_URL
    from prefect.types.entrypoint import EntrypointType

    from flows.allowed import allow_served
    from flows.server import HEARTBEAT_TAG, watched_runs
    from flows.settings import source_urls
    from flows.wiki_pipeline import wiki_pipeline
    from tasks.sources.download import DownloadKnobs

    settings = checked(args)
    check_prefect_server()
    allow_served(settings.run.root(), source_urls(dict(settings)).values())  # the operator's own choices
    parameters = flow_parameters(settings)
    DownloadKnobs.from_env()  # the runner's environment is what its flow runs download with
    # Prefect's runner (what `flow.serve` starts), asking the server for runs to start every POLL_SECONDS
    # (Prefect's default, 10 s, would be most of a cached rerun's time); the deployment's parameters are the
    # chosen settings, so a bare `prefect deployment run wiki-pipeline/wiki-pipeline` and the UI's Run button
    # run what `serve` was given; its flow runs beat, and carry the tag the crash automation watches
    with watched_runs():
        runner = Runner(name=DEPLOYMENT, query_seconds=POLL_SECONDS, limit=args.limit)
        deployment_id = runner.add_flow(
            wiki_pipeline,
            name=DEPLOYMENT,
            parameters=parameters or None,
            entrypoint_type=EntrypointType.MODULE_PATH,
            description="Wikipedia -> BPE -> token shards -> mygpt -> samples (chapter 28)",
            tags=[HEARTBEAT_TAG],
        )
        ui = PREFECT_UI_URL.value()
        print(
            f"wiki-pipeline/{DEPLOYMENT} is being served (asking for runs every {POLL_SECONDS} s): run it with "
            f"`prefect deployment run wiki-pipeline/{DEPLOYMENT}`"
            + (f" or the Run button at {ui}/deployments/deployment/{deployment_id}" if ui else ""),
            flush=True,
        )
        try:
            asyncio.run(runner.start())
        except (KeyboardInterrupt, TerminationSignal) as e:
            print(f"{type(e).__name__}: the runner stopped", file=sys.stderr, flush=True)
    return 0


def cmd_params(args) -> int:
    print(json.dumps(flow_parameters(checked(args))))
    return 0
