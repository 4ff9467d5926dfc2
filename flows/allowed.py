"""What a run may touch on this machine: the artifact roots (``WIKI_PIPELINE_ALLOWED_ROOTS``), source URLs
(``WIKI_PIPELINE_ALLOWED_SOURCES``) and Dask schedulers (``WIKI_PIPELINE_ALLOWED_SCHEDULERS``) its environment
allows; unset means the defaults for a deployment run (for schedulers: none, only a local cluster the run starts)
and everything for a person's own run (docs/SERVING.md). :func:`check_allowed` refuses the rest with a
``UserError``; the source list is :class:`tasks.sources.allowed.SourcePolicy`, which each download is handed to
check its redirects with. The environment is
the worker's own: the work pool's base job template (:data:`WORK_POOL_TEMPLATE`) lets no caller set a run's
environment, command or working directory."""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Iterable, Mapping

from mygpt.errors import UserError
from tasks.sources.allowed import DEFAULT, ENV_SOURCES, SourcePolicy, in_deployment_run
from tasks.store import normal_url

ENV_ROOTS = "WIKI_PIPELINE_ALLOWED_ROOTS"
ENV_SCHEDULERS = "WIKI_PIPELINE_ALLOWED_SCHEDULERS"
WORK_POOL_TEMPLATE = "prefect-work-pool.json"  # in the repository root: what a work pool lets a run's caller vary
WORKER_JOB_VARIABLES = ("command", "env", "working_dir")  # what the worker runs, and with which environment


def default_roots() -> list[str]:
    from tasks.store import default_root

    return [str(default_root())]


def allowed_roots(deployment: bool = False) -> list[str] | None:
    """The allowed artifact roots from the environment (absolute), or None when every root is allowed; unset, the
    defaults for a deployment run."""
    value = os.environ.get(ENV_ROOTS, "").strip() or (DEFAULT if deployment else "")
    if not value:
        return None
    roots = []
    for item in (i.strip() for i in re.split(r":(?!//)", value)):  # the colon of s3:// separates nothing
        if item == DEFAULT:
            roots += default_roots()
        elif item.lower().startswith("s3://"):
            try:
                roots.append(normal_url(item))
            except ValueError as exc:
                raise UserError(f"{ENV_ROOTS}: {exc}") from None
        elif item:
            if not os.path.isabs(os.path.expanduser(item)):
                raise UserError(f"{ENV_ROOTS}: {item!r} is not an absolute path; list absolute directories")
            roots.append(os.path.expanduser(item))
    return roots


def allowed_schedulers(deployment: bool = False) -> list[tuple[str, str, int]] | None:
    """The Dask schedulers a run may name, as ``(scheme, host, port)``, or None when every one is allowed; unset,
    none for a deployment run (a scheduler runs code in the flow run: Dask ships pickles)."""
    from tasks.core.dask_work import address_parts

    value = os.environ.get(ENV_SCHEDULERS, "").strip()
    if not value:
        return [] if deployment else None
    schedulers = []
    for item in re.split(r"[\s,]+", value):
        if item and item != DEFAULT:  # the default is no scheduler: a local cluster the run starts itself
            parts = address_parts(item)
            if parts is None:
                raise UserError(
                    f"{ENV_SCHEDULERS}: {item!r} is not a Dask scheduler address like tls://host:8786 or "
                    "tcp://host:8786; fix it"
                )
            schedulers.append(parts)
    return schedulers


def allow_served(root: str, source_urls: Iterable[str]) -> None:
    """Where a list is unset, let this runner's deployment runs use the root and sources ``serve`` was given, besides
    the defaults (set in this process's environment, which its flow runs inherit)."""
    if not os.environ.get(ENV_ROOTS, "").strip():
        os.environ[ENV_ROOTS] = os.pathsep.join([DEFAULT, root])
    if not os.environ.get(ENV_SOURCES, "").strip():
        os.environ[ENV_SOURCES] = " ".join([DEFAULT, *(_plain(u) for u in source_urls)])


def _plain(url: str) -> str:
    """``url`` without user info, query or fragment (an allow-list entry holds no credentials)."""
    u = urllib.parse.urlsplit(url)
    return u._replace(netloc=u.netloc.rpartition("@")[2], query="", fragment="").geturl()


def check_allowed(root: str, source_urls: Mapping[str, str], dask_address: str | None = None) -> None:
    """``UserError`` when the artifact root ``root``, one of ``source_urls`` (what the run's stages read from
    outside the store, by the setting that names it: ``{"corpus.source_url": url}``) or the Dask scheduler
    ``dask_address`` is outside this machine's allow-lists (for a deployment run, the defaults when unset)."""
    deployment = in_deployment_run()
    if deployment:
        check_work_pool()
    roots = allowed_roots(deployment)
    if roots is not None and not any(_under(root, allowed) for allowed in roots):
        resolved = root if "://" in root else os.path.realpath(root)
        raise UserError(
            f"run.artifacts_dir {root} (resolved: {resolved}) is outside the artifact roots this "
            f"machine allows ({_shown(ENV_ROOTS, os.pathsep.join(roots))}); choose a root inside one of them, or "
            f"ask whoever runs this worker to add yours to {ENV_ROOTS}"
        )
    sources = SourcePolicy.from_env(deployment)
    for field, source_url in source_urls.items():
        sources.check(field, source_url)
    if dask_address:
        _check_scheduler(dask_address, allowed_schedulers(deployment))


def open_job_variables(base_job_template: dict) -> list[str]:
    """What a work pool with ``base_job_template`` lets whoever triggers a run set of :data:`WORKER_JOB_VARIABLES`:
    those its variables declare, and any job variable where it does not refuse undeclared ones (Prefect's worker
    merges a caller's ``env`` into a fixed one all the same)."""
    variables = base_job_template.get("variables") or {}
    opened = [name for name in WORKER_JOB_VARIABLES if name in (variables.get("properties") or {})]
    if variables.get("additionalProperties", True) is not False:
        opened.append("any job variable it does not declare (it lacks additionalProperties: false)")
    return opened


def check_work_pool() -> None:
    """``UserError`` when this flow run came through a work pool whose base job template lets the run's caller set
    the worker's command, environment or working directory (and so the allow-lists). Why at every run: a pool made
    with Prefect's stock template then fails every run, naming the fix, instead of staying open unnoticed."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    pool = ctx.flow_run.work_pool_name if ctx and ctx.flow_run else None
    if not pool:  # a runner's run (wiki-pipeline serve): no pool, and no job variables reach its process
        return
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        opened = open_job_variables(client.read_work_pool(pool).base_job_template)
    if opened:
        raise UserError(
            f"work pool {pool} lets whoever triggers a run set {', '.join(opened)}: the worker's command or "
            f"environment, and with it {ENV_ROOTS}; whoever runs the worker: give the pool this repository's "
            f"template, prefect work-pool create {pool} --type process --base-job-template {WORK_POOL_TEMPLATE} "
            "--overwrite (docs/TEAM.md)"
        )


def _check_scheduler(address: str, schedulers: list[tuple[str, str, int]] | None) -> None:
    from tasks.core.dask_work import address_parts

    if schedulers is None or address_parts(address) in schedulers:
        return
    if os.environ.get(ENV_SCHEDULERS, "").strip():
        shown = f"{ENV_SCHEDULERS}={os.environ[ENV_SCHEDULERS].strip()}"
    else:
        shown = f"{ENV_SCHEDULERS} is unset, so a deployment run may use only a local cluster it starts itself"
    raise UserError(
        f"run.dask_address {address} is not a Dask scheduler this machine allows ({shown}; a scheduler runs code "
        f"in the flow run, as Dask ships pickles); leave dask_address unset for a local cluster, or ask whoever "
        f"runs this worker to add the scheduler to {ENV_SCHEDULERS} (docs/TEAM.md: a team's cluster over TLS)"
    )


def _shown(name: str, value: str) -> str:
    """``NAME=value``, or what the defaults are where ``NAME`` is unset (a deployment run)."""
    if os.environ.get(name, "").strip():
        return f"{name}={value}"
    return f"{name} is unset, so a deployment run gets the defaults: {value}"


def _under(path: str, root: str) -> bool:
    """Whether the artifact root ``path`` is inside the allowed ``root`` (directories, or ``s3://`` prefixes
    compared segment by segment)."""
    remote = [p.strip().lower().startswith("s3://") for p in (path, root)]
    if any(remote):
        if not all(remote):
            return False
        try:
            path, root = normal_url(path), normal_url(root)
        except ValueError:
            return False
        return path == root or path.startswith(root.rstrip("/") + "/")
    path, root = os.path.realpath(path), os.path.realpath(root)
    return os.path.commonpath([path, root]) == root
