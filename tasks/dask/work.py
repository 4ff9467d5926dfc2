"""The data stages' chunk work on Dask: the cluster (local, or ``run.dask_address``) and the functions its
workers run. A chunk is a byte range a worker reads itself; :func:`ordered_results` hands results back in file
order with a bounded window, so memory stays at a few chunks (docs/PIPELINE.md, "The data stages on Dask").
Imports only ``mygpt`` and numpy at the top, so a worker that unpickles these functions loads no Prefect.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import itertools
import logging
import multiprocessing.spawn
import os
import pickle
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from mygpt.errors import UserError

DEFAULT_CHUNK_BYTES = 8 << 20  # bytes of text per chunk unless run.chunk_bytes says otherwise
CONNECT_TIMEOUT_S = 10  # how long to try to reach run.dask_address before giving up
SCHEMES = ("tcp", "tls")  # the Dask protocols dask_address may name (none = tcp)
TLS_SETTINGS = (
    "distributed.comm.tls.ca-file and distributed.comm.tls.client.cert (+ .key), e.g. "
    "DASK_DISTRIBUTED__COMM__TLS__CA_FILE, DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT, "
    "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY"
)
_TOKENIZERS: dict[str, Any] = {}  # in a worker: tokenizer key -> tokenizer (a BPE's word cache carries over)


class ClusterError(UserError):
    """``run.dask_address`` names no usable cluster; the message says what to do (stages pass it on unchanged)."""


def default_workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def local_workers(run) -> int:
    """How many workers ``run``'s local cluster has."""
    return run.workers or default_workers()


def chunk_bytes(run) -> int:
    """How many bytes of text ``run``'s chunks hold (the tokenizer's word counts, the shards' encoding)."""
    return run.chunk_bytes or DEFAULT_CHUNK_BYTES


# ---- what the workers run ------------------------------------------------------------------------------
def encode_range(
    tokenizer_key: str, tokenizer_json: str, path: str, start: int, end: int, unk_policy: str, ends: tuple = ()
) -> tuple:
    """``(ids, stats as a dict)`` of bytes ``start..end`` of ``path``; the tokenizer (``tokenizer_json``:
    ``{"kind": ..., "state": ...}``, a tokenizer file's text) is built once per worker; ``ends``: where documents
    end (:func:`mygpt.tokenizers.bpe_chunks.encode_chunk`)."""
    import json

    from mygpt.tokenizers.bpe_chunks import encode_chunk
    from mygpt.tokenizers.files import tokenizer_from_state

    tok = _TOKENIZERS.get(tokenizer_key)
    if tok is None:
        _TOKENIZERS.clear()
        sent = json.loads(tokenizer_json)
        tok = _TOKENIZERS[tokenizer_key] = tokenizer_from_state(sent["kind"], sent["state"])
    with _reading(path, start, end):
        ids, stats = encode_chunk(tok, path, start, end, unk_policy, opener=opener(path), ends=ends)
    return ids, stats.to_dict()


def count_chunk(path: str, start: int, end: int) -> bytes:
    """The word counts of bytes ``start..end`` of ``path``, pickled (Dask ships one buffer much faster than it
    walks a dict of ~10**5 words); :func:`word_counts` unpickles it."""
    from mygpt.tokenizers.bpe_chunks import read_chunk
    from mygpt.tokenizers.bpe_train import count_words

    with _reading(path, start, end):
        text = read_chunk(path, start, end, opener(path))
    return pickle.dumps(count_words(text), protocol=5)


def word_counts(result: bytes) -> dict[str, int]:
    """The table :func:`count_chunk` sent."""
    return pickle.loads(result)


@contextlib.contextmanager
def _reading(where: str, start: int, end: int) -> Iterator[None]:
    """A worker's failure to read its range from the object store, as one line naming it (a ``UserError``)."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:
        if "://" not in where:
            raise
        raise UserError(
            f"a Dask worker could not read bytes {start}-{end} of {where} from the artifact store "
            f"({type(exc).__name__}: {exc}); check the store is up and the worker's AWS environment reaches it, "
            "then rerun: the shards written so far are kept"
        ) from None


def opener(where: str):
    """How a worker opens ``where``: None (a local file) or, for ``s3://``, a ranged read with no read-ahead and
    the worker's own AWS credentials."""
    if "://" not in where:
        return None
    from tasks.store import filesystem

    fs = _FILESYSTEMS["s3"] = filesystem()
    return lambda url: fs.open(url, "rb", cache_type="none")


_FILESYSTEMS: dict[str, Any] = {}


def worker_can_read(path: str) -> bool:
    if "://" in path:
        open_ = opener(path)
        assert open_ is not None
        try:
            with open_(path) as f:
                f.read(1)
        except Exception:
            return False
        return True
    return os.access(path, os.R_OK)


# ---- the cluster -------------------------------------------------------------------------------------------
def address_parts(address: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` of a Dask scheduler address (no scheme = ``tcp``; scheme and host lower-cased), or
    None when it is not ``tcp://`` or ``tls://`` host and port 1..65535: how allow-list entries are compared."""
    import re

    m = re.fullmatch(r"(?:([A-Za-z][A-Za-z0-9+.-]*)://)?(\[[0-9a-fA-F:.]+\]|[^\s/:@\[\]]+):(\d{1,5})", address.strip())
    scheme = (m.group(1) or "tcp").lower() if m else ""
    if not m or scheme not in SCHEMES or not 0 < int(m.group(3)) < 65536:
        return None
    return scheme, m.group(2).lower(), int(m.group(3))


def check_address(address: str) -> str:
    """``address`` stripped when Dask can use it (``tcp://`` or ``tls://`` with Dask's TLS settings, host,
    port); ``ValueError`` with the fix otherwise."""
    address = address.strip()
    parts = address_parts(address)
    if parts is None:
        raise ValueError(
            f"dask_address must be a Dask scheduler address, tcp://host:port or tls://host:port (port 1..65535; "
            f"the scheduler's port, 8786 by default, not its dashboard's), got {address!r}"
        )
    if parts[0] == "tls" and _security().get_connection_args("client")["ssl_context"] is None:
        raise ValueError(
            f"dask_address {address}: tls:// needs Dask's TLS settings in this process's environment: "
            f"{TLS_SETTINGS} (see docs/PIPELINE.md, Dask over TLS)"
        )
    return address


def _security() -> Any:
    """Dask's security settings as configured (``distributed.comm.tls.*``: the Dask config files or
    ``DASK_DISTRIBUTED__COMM__TLS__*``); plain TCP when none are."""
    from distributed.security import Security

    return Security()


_LEVELS_LOCK = threading.Lock()
_RAISED: dict[str, list[int]] = {}  # logger name -> [blocks holding it raised, the level to restore]


@contextlib.contextmanager
def _raised_level(name: str, level: int) -> Iterator[None]:
    """Logger ``name`` at ``level`` or above for the block; the level it had before the first of several such
    blocks is restored when the last one ends. Why: two flow runs in one process (each in its thread) start and
    close clusters at the same time, and a block that saved and restored on its own could restore another's
    raised level for good, hiding the warnings from then on."""
    logger = logging.getLogger(name)
    with _LEVELS_LOCK:
        held = _RAISED.setdefault(name, [0, logger.level])
        held[0] += 1
        logger.setLevel(max(level, logger.level))
    try:
        yield
    finally:
        with _LEVELS_LOCK:
            held[0] -= 1
            if held[0] == 0:
                del _RAISED[name]
                logger.setLevel(held[1])


@contextlib.contextmanager
def dask_client(run, log, *, needs: Iterable[str] = ()) -> Iterator[Any]:
    """A ``distributed.Client`` for ``run``, the local cluster closed on exit; ``needs``: files every worker
    must read (checked up front on an existing cluster)."""
    from distributed import Client

    # distributed's INFO lines (cluster start and stop, every connection: a few dozen a stage) out of the log
    with _raised_level("distributed", logging.WARNING):
        if run.dask_address:
            client = _connect(run.dask_address)
            try:
                _check_workers(client, run.dask_address, needs)
                log.info(
                    "dask: using the cluster at %s (%d workers)",
                    run.dask_address,
                    len(client.scheduler_info()["workers"]),
                )
                yield client
            finally:
                client.close()
            return
        n = local_workers(run)
        with _local_cluster(n) as cluster, Client(cluster, set_as_default=False) as client:
            log.info(
                "dask: local cluster of %d worker%s (%s)",
                n,
                "s" if n > 1 else "",
                "processes on 127.0.0.1" if n > 1 else "threads in this process",
            )
            yield client


def _local_cluster(n: int) -> Any:
    import dask
    from distributed import LocalCluster

    # every listener on 127.0.0.1: the scheduler's HTTP endpoint and each worker's (/health, /metrics: Dask
    # binds a worker's to its transport's host, and an in-process worker's transport has none, so it would
    # listen on every interface); no dashboards (bokeh is not installed)
    common: dict[str, Any] = dict(
        threads_per_worker=1,
        dashboard_address=None,
        worker_dashboard_address="127.0.0.1:0",
        silence_logs=logging.WARNING,
        scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
    )
    if n == 1:  # one worker: scheduler and worker threads in this process (in-process transport), nothing to start
        return LocalCluster(n_workers=1, processes=False, **common)
    # Dask's nannies set MALLOC_TRIM_THRESHOLD_=65536 in their workers, which turns off glibc's adaptive mmap
    # threshold: every numpy temporary of the chunk work is then mmap'ed and unmapped again, page faults and
    # all, and the chunks run at half speed. Leave malloc alone.
    with (
        dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}),
        _main_module_hidden(),
    ):
        return LocalCluster(n_workers=n, processes=True, host="127.0.0.1", **common)


_MAIN_LOCK = threading.Lock()
#: The name distributed's nanny gives the worker process it spawns.
_WORKER_PROCESS = "Dask Worker process (from Nanny)"


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """The worker processes the nannies spawn during the block are prepared without this process's main module
    (``multiprocessing.spawn.get_preparation_data`` less its ``init_main_from_*``), so they do not import it
    first. Why: that is the flow's entry point (``prefect.engine``, the CLI, a bench script), which imports Prefect
    and the whole pipeline: about 3 s of CPU per worker, paid at every cluster start, for nothing the workers run
    (they unpickle functions from this module, which imports only ``mygpt``). Only those spawns are changed:
    ``sys.modules["__main__"]`` stays, for whatever else this process reads or pickles by reference from it
    meanwhile (another thread, another flow run), and any other process spawned meanwhile is prepared as usual.
    A worker the nanny restarts later imports it as usual."""
    with _MAIN_LOCK:
        real = multiprocessing.spawn.get_preparation_data

        def without_main(name: str) -> dict[str, Any]:
            data = real(name)
            if name == _WORKER_PROCESS:
                data.pop("init_main_from_path", None)
                data.pop("init_main_from_name", None)
            return data

        multiprocessing.spawn.get_preparation_data = without_main
        try:
            yield
        finally:
            multiprocessing.spawn.get_preparation_data = real


def _probe(address: str, security: Any) -> str:
    """Who answers at ``address`` (``"Scheduler"``), under one deadline: Dask's client would wait forever on a
    port that never answers in its protocol. ``TimeoutError`` or the connection's own error otherwise."""
    from distributed.comm import connect
    from distributed.core import send_recv

    async def ask() -> str:
        comm = await connect(address, timeout=CONNECT_TIMEOUT_S, **security.get_connection_args("client"))
        try:
            reply = await send_recv(comm, op="identity")
        finally:
            comm.abort()
        return str(reply.get("type")) if isinstance(reply, dict) else repr(reply)

    async def within_deadline() -> str:
        return await asyncio.wait_for(ask(), CONNECT_TIMEOUT_S)

    # a thread of its own: asyncio.run needs a thread without a running event loop (a Prefect task may have one)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dask-probe") as pool:
        return pool.submit(asyncio.run, within_deadline()).result()


def _connect(address: str) -> Any:
    from distributed import Client as DaskClient

    fix = "fix dask_address, or leave it unset to use a local cluster"
    security = _security()
    who, failure = "", None
    try:
        who = _probe(address, security)
    except Exception as e:  # each kind of failure is told apart below
        failure = e
    # a closed port: Dask retries the connection until its timeout, then says so with an OSError "Timed out ...";
    # a port that accepts and never answers: our deadline's TimeoutError
    if isinstance(failure, TimeoutError) or (isinstance(failure, OSError) and str(failure).startswith("Timed out")):
        raise ClusterError(
            f"dask_address {address}: no Dask scheduler answered within {CONNECT_TIMEOUT_S} s (nothing listens "
            f"there, or something that is not a Dask scheduler does); start one there (dask scheduler, plus dask "
            f"worker processes) or {fix}"
        ) from None
    if failure is not None:  # refused, reset, TLS handshake failed: each says why in its text
        why = str(failure).splitlines()[0] if str(failure) else type(failure).__name__
        tls = "" if address.startswith("tls://") else "; a scheduler that speaks TLS needs tls://host:port"
        raise ClusterError(
            f"dask_address {address}: could not talk to a Dask scheduler there ({why}){tls}; {fix}"
        ) from None
    if who != "Scheduler":
        raise ClusterError(f"dask_address {address}: a Dask {who}, not a scheduler, answers there; {fix}")
    try:
        return DaskClient(address, timeout=CONNECT_TIMEOUT_S, security=security, set_as_default=False)
    except (OSError, TimeoutError) as e:
        raise ClusterError(f"dask_address {address}: the scheduler stopped answering ({e}); {fix}") from None


def _check_workers(client, address: str, needs: Iterable[str]) -> None:
    needs = list(needs)
    try:
        client.wait_for_workers(1, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError):
        raise ClusterError(
            f"dask_address {address}: the scheduler has no workers; start some (dask worker "
            f"{address}) on machines that share the artifact root"
        ) from None
    for path in needs:
        seen = client.run(worker_can_read, path)
        blind = sorted(w for w, ok in seen.items() if not ok)
        if blind:
            raise ClusterError(
                f"dask_address {address}: worker(s) {', '.join(blind)} cannot read {path}; "
                + (
                    "give every worker the AWS environment that reaches the bucket (AWS_ENDPOINT_URL and the "
                    "credentials)"
                    if "://" in path
                    else "a local artifact root must be on a filesystem every worker shares, at the same path (or "
                    "use an s3:// root, which workers read by range)"
                )
            )


# ---- chunks in, results out in order ------------------------------------------------------------------------
def ordered_results(
    client, fn: Callable, items: Iterable[tuple], args: Callable[[tuple], tuple], *, window: int, name: str
) -> Iterator[tuple[tuple, Any]]:
    """``(item, fn(*args(item)))`` for each item, computed on the cluster, yielded in the items' order, at most
    ``window`` ahead; unconsumed futures are cancelled when the caller stops."""
    from distributed import KilledWorker

    items = iter(items)
    pending: collections.deque = collections.deque()
    run_token = uuid.uuid4().hex[:12]  # task keys unique to this call: a shared scheduler must not confuse runs

    def submit(item: tuple) -> None:
        index = item[0]
        key = f"{name}-{run_token}-{index}"
        pending.append((item, client.submit(fn, *args(item), key=key, priority=-index, pure=False)))

    try:
        for item in itertools.islice(items, window):
            submit(item)
        while pending:
            item, future = pending.popleft()
            try:
                result = future.result()
            except KilledWorker as e:
                raise RuntimeError(
                    f"{name}: chunk {item[0]} (bytes {item[1]}..{item[2]}) killed the Dask workers "
                    f"that ran it ({e}); rerun to resume from the last finished shard"
                ) from None
            future.release()
            nxt = next(items, None)
            if nxt is not None:
                submit(nxt)
            yield item, result
    finally:
        if pending:
            client.cancel([f for _, f in pending], force=True)
