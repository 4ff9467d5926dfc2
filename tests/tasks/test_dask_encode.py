"""The data stages on Dask: the same bytes on an external cluster (a real ``dask scheduler`` and two ``dask worker``
processes on 127.0.0.1), a worker SIGKILLed mid-encode, an unreachable ``dask_address``, loopback-only addresses."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from flows.server import free_port
from mygpt.errors import UserError
from tasks import shards
from tasks.core.settings import RunOptions
from tasks.dask import work as dask_work
from tests.support import REPO, stages
from tests.support.corpora import corpus_from_text, shared_splits
from tests.support.processes import stop_processes
from tests.support.wait import wait_for

SHARD = 20_000
CHUNK = 20_000


def loopback_only(pids) -> list[str]:
    """Every listening TCP socket of these processes that is not on 127.0.0.1 (should be none)."""
    wrong = []
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.Error:
            continue
        wrong += [f"{pid}: {c.laddr}" for c in conns if c.status == psutil.CONN_LISTEN and c.laddr.ip != "127.0.0.1"]
    return wrong


class ExternalCluster:
    """``dask scheduler`` + ``dask worker`` processes (no nannies: a killed worker stays dead) on 127.0.0.1."""

    def __init__(
        self,
        tmp: Path,
        workers: int = 2,
        tls: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        cwd: Path = REPO,
    ) -> None:
        """``tls``: Dask's ``distributed.comm.tls.*`` settings (ca-file, client.cert, client.key); the scheduler and
        workers then speak TLS with that CA and certificate, and accept only peers whose certificate it signed.
        ``env``: added to the processes' environment; ``cwd``: their working directory."""
        self.env, self.cwd = ({**os.environ, **env} if env else None), cwd
        bin_dir = Path(sys.executable).parent
        self.tls = tls
        secure = (
            ["--protocol", "tls", "--tls-ca-file", tls["ca-file"], "--tls-cert", tls["client.cert"]]
            + ["--tls-key", tls["client.key"]]
            if tls
            else []
        )
        self.procs: list[subprocess.Popen] = []
        self.log = open(tmp / "dask.log", "w")
        sched_file = tmp / "scheduler.json"
        self.scheduler = self._start(
            [
                bin_dir / "dask",
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                str(free_port()),
                "--no-dashboard",
                "--dashboard-address",
                "127.0.0.1:0",
                "--scheduler-file",
                str(sched_file),
                *secure,
            ]
        )
        self.address = wait_for(
            lambda: sched_file.exists() and json.loads(sched_file.read_text() or "{}").get("address"),
            "the scheduler's address",
        )
        self.workers = [
            self._start(
                [
                    bin_dir / "dask",
                    "worker",
                    self.address,
                    "--host",
                    "127.0.0.1",
                    "--nthreads",
                    "1",
                    "--no-nanny",
                    "--no-dashboard",
                    "--dashboard-address",
                    "127.0.0.1:0",
                    "--name",
                    f"w{i}",
                    "--death-timeout",
                    "60",
                    *secure,
                ]
            )
            for i in range(workers)
        ]
        with self.client() as c:
            c.wait_for_workers(workers, timeout=120)

    def _start(self, cmd) -> subprocess.Popen:
        proc = subprocess.Popen(
            [str(c) for c in cmd], cwd=self.cwd, env=self.env, stdout=self.log, stderr=subprocess.STDOUT
        )
        self.procs.append(proc)
        return proc

    def client(self):
        from distributed import Client
        from distributed.security import Security

        security = (
            Security(
                **{
                    "tls_ca_file": self.tls["ca-file"],
                    "tls_client_cert": self.tls["client.cert"],
                    "tls_client_key": self.tls["client.key"],
                }
            )
            if self.tls
            else None
        )
        return Client(self.address, timeout=30, security=security, set_as_default=False)

    def stop(self) -> None:
        stop_processes(*reversed(self.procs), timeout=20)
        self.log.close()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dask-art")
    corpus = corpus_from_text(root, tmp_path_factory.mktemp("dask-src"), shared_splits())
    tokenizer = stages.tokenizer(root, corpus, num_merges=64, bpe_train_bytes=60_000, run={"workers": 1})
    return root, corpus, tokenizer


@pytest.fixture(scope="module")
def baseline(inputs):
    root, corpus, tokenizer = inputs
    return stages.shards(root, corpus, tokenizer, shard_tokens=SHARD, run={"workers": 1, "chunk_bytes": CHUNK})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = ExternalCluster(tmp_path_factory.mktemp("dask-cluster"))
    try:
        yield c
    finally:
        c.stop()


def copy_inputs(inputs, root: Path):
    src, corpus, tokenizer = inputs
    for stage in shards.STAGE.inputs:  # the shards stage reads these
        shutil.copytree(Path(src) / stage, root / stage)
    return root, corpus, tokenizer


def manifest(ref) -> dict:
    return json.loads((Path(ref["path"]) / "manifest.json").read_text())


def test_external_cluster_gives_the_same_shards_and_merges(inputs, baseline, cluster, tmp_path):
    assert loopback_only([p.pid for p in cluster.procs]) == []
    root, corpus, tokenizer = copy_inputs(inputs, tmp_path / "art")
    ref = stages.shards(
        root, corpus, tokenizer, shard_tokens=SHARD, run={"dask_address": cluster.address, "chunk_bytes": CHUNK}
    )
    assert ref["version"] == baseline["version"]
    m = manifest(ref)
    assert m["metrics"]["workers"] == 2 and m["metrics"]["dask"] == cluster.address
    assert m["files"] == manifest(baseline)["files"]  # every shard's size and sha256
    with cluster.client() as c:  # both workers took part: each built the tokenizer once
        assert c.run(lambda: len(dask_work._TOKENIZERS)) == {a: 1 for a in c.scheduler_info()["workers"]}

    shutil.copytree(Path(inputs[0]) / "corpus", tmp_path / "art2" / "corpus")  # the corpus only: train again
    again = stages.tokenizer(
        tmp_path / "art2",
        corpus,
        num_merges=64,
        bpe_train_bytes=60_000,
        run={"dask_address": cluster.address, "chunk_bytes": 10_000},
    )
    assert again["version"] == tokenizer["version"]
    assert manifest(again)["files"]["tokenizer.json"] == manifest(tokenizer)["files"]["tokenizer.json"]


def test_unreachable_dask_address_fails_fast_naming_it(inputs, tmp_path, monkeypatch):
    monkeypatch.setattr(dask_work, "CONNECT_TIMEOUT_S", 2)
    root, corpus, tokenizer = copy_inputs(inputs, tmp_path / "art")
    address = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(UserError, match=rf"dask_address {address}: no Dask scheduler answered within 2 s"):
        stages.shards(root, corpus, tokenizer, shard_tokens=SHARD, run={"dask_address": address})
    assert not [p for p in (root / "shards").iterdir() if not p.name.startswith(".")]


def _cmdline(p: psutil.Process) -> list[str]:
    """``p``'s command line; none for a child that has ended (a zombie not yet reaped, or gone)."""
    try:
        return p.cmdline()
    except (psutil.ZombieProcess, psutil.NoSuchProcess):
        return []


def test_local_cluster_listens_on_loopback_only():
    import logging

    me = psutil.Process()
    with dask_work.dask_client(RunOptions(workers=2), logging.getLogger("test")) as client:
        assert len(client.scheduler_info()["workers"]) == 2
        assert client.scheduler.address.startswith("tcp://127.0.0.1:")
        assert all(a.startswith("tcp://127.0.0.1:") for a in client.scheduler_info()["workers"])
        kids = me.children(recursive=True)
        assert loopback_only([me.pid, *(p.pid for p in kids)]) == []
        workers = [p.pid for p in kids if "spawn_main" in " ".join(_cmdline(p))]  # not multiprocessing's tracker
        assert len(workers) == 2
    wait_for(
        lambda: (
            not [
                p
                for p in me.children(recursive=True)
                if p.pid in workers and p.is_running() and p.status() != psutil.STATUS_ZOMBIE
            ]
        ),
        "the local cluster's processes to end",
        timeout=60,
    )


MAIN_SCRIPT = """
import logging, os, sys
with open(os.environ["IMPORTS_LOG"], "a") as f:
    f.write(__name__ + "\\n")
if __name__ == "__main__":
    from tasks.core.settings import RunOptions
    from tasks.dask import work
    with work.dask_client(RunOptions(workers=2), logging.getLogger("test")) as client:
        seen = client.run(lambda: "prefect" in sys.modules)
    print(sorted(seen.values()))
"""


def test_local_cluster_workers_do_not_import_the_main_module(tmp_path):
    """The workers unpickle functions from ``tasks.dask.work``; the flow process's entry point (which imports
    Prefect) is not run again in each of them."""
    script, log = tmp_path / "entry.py", tmp_path / "imports.log"
    script.write_text("import prefect  # the entry point's weight\n" + MAIN_SCRIPT)
    env = {**os.environ, "IMPORTS_LOG": str(log), "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[False, False]"  # two workers, neither has Prefect
    assert log.read_text().split() == ["__main__"]  # imported once: here, as the entry point


MAIN_PICKLER = """
import logging, pickle, sys, threading
from tasks.core.settings import RunOptions
from tasks.dask import work


class Params:  # a user's flow script: an object of its own, pickled by reference
    pass


failures, done = [], threading.Event()


def pickle_meanwhile():  # another flow run, or Prefect, in another thread of the same process
    while not done.is_set():
        try:
            pickle.loads(pickle.dumps(Params()))
        except Exception as exc:
            failures.append(repr(exc))


if __name__ == "__main__":
    t = threading.Thread(target=pickle_meanwhile)
    t.start()
    try:
        with work.dask_client(RunOptions(workers=2), logging.getLogger("test")) as client:
            seen = client.run(lambda: "prefect" in sys.modules)
    finally:
        done.set()
        t.join()
    print(sorted(seen.values()), sys.modules["__main__"].Params is Params, failures[:1])
"""


def test_the_main_module_is_still_there_for_other_threads_while_a_local_cluster_starts(tmp_path):
    """Review: ``_main_module_hidden`` replaced ``sys.modules["__main__"]`` for the whole process while the cluster
    started, so anything another thread pickled by reference from the entry point meanwhile (an object of a
    user's flow script, with the standard pickle) failed: "attribute lookup Params on __main__ failed". The
    workers must still not import the main module, and nothing else in the flow process may notice."""
    script = tmp_path / "flow_script.py"
    script.write_text(MAIN_PICKLER)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[False, False] True []"


def test_only_a_nanny_s_worker_is_spawned_without_the_main_module_and_an_error_restores_it():
    """Review: a process another thread spawns while the cluster starts is prepared as usual (it may need the
    entry point), and an exception during the start puts multiprocessing back as it was."""
    import multiprocessing.spawn

    real = multiprocessing.spawn.get_preparation_data
    with pytest.raises(RuntimeError, match="start failed"), dask_work._main_module_hidden():
        patched = multiprocessing.spawn.get_preparation_data
        assert patched("another process") == real("another process")
        worker = patched(dask_work._WORKER_PROCESS)
        assert not {"init_main_from_path", "init_main_from_name"} & set(worker)
        raise RuntimeError("start failed")
    assert multiprocessing.spawn.get_preparation_data is real


def test_sigkill_one_worker_mid_encode_still_gives_the_same_shards(inputs, baseline, cluster, tmp_path):
    """Runs last in this module: it kills one of the module cluster's two workers for good."""
    root, corpus, tokenizer = copy_inputs(inputs, tmp_path / "art")
    outcome: dict = {}

    def encode():
        try:
            outcome["ref"] = stages.shards(
                root, corpus, tokenizer, shard_tokens=SHARD, run={"dask_address": cluster.address, "chunk_bytes": 4096}
            )
        except BaseException as e:
            outcome["error"] = e

    record = root / "shards" / ".staging" / baseline["version"] / "work" / "progress.json"

    def first_shard_recorded():
        try:
            return json.loads(record.read_text())["splits"]["train"]["shards"]
        except (OSError, ValueError, KeyError):
            return None

    thread = threading.Thread(target=encode, daemon=True)
    thread.start()
    with cluster.client() as c:
        wait_for(first_shard_recorded, "the first shard of the stage")
        pids = c.run(os.getpid)
        busy = wait_for(lambda: [a for a, keys in c.processing().items() if keys], "a worker running a chunk")
        victim = next(p for p in cluster.workers if p.pid == pids[busy[0]])
        assert not json.loads(record.read_text())["splits"]["train"]["done"]  # mid-encode
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
        thread.join(300)
        assert not thread.is_alive() and "error" not in outcome, outcome.get("error")
        assert len(c.scheduler_info()["workers"]) == 1  # the other worker took over the killed one's chunks
    assert manifest(outcome["ref"])["files"] == manifest(baseline)["files"]


# ---- dask_address: every wrong one is one clear error naming it ----------------------------------
@pytest.mark.parametrize(
    "address, says",
    [
        ("http://127.0.0.1:8787", "dask_address must be a Dask scheduler address, tcp://host:port or tls://host:port"),
        ("127.0.0.1:99999", "dask_address must be a Dask scheduler address"),
        ("tcp://a@b:8786", "dask_address must be a Dask scheduler address"),
        ("tls://127.0.0.1:8786", "dask_address tls://127.0.0.1:8786: tls:// needs Dask's TLS settings"),
    ],
)
def test_a_dask_address_dask_cannot_use_is_refused_up_front(address, says):
    with pytest.raises(UserError) as e:
        RunOptions.parse({"dask_address": address}, "run")
    assert str(e.value).startswith(f"run.{says}"), str(e.value)
    assert address in str(e.value)


def test_a_dask_address_where_no_scheduler_answers_fails_within_the_deadline(inputs, tmp_path, monkeypatch):
    """An HTTP server at the address accepts the connection and never answers in Dask's protocol: Dask's client
    waited for it forever; now the stage fails at the connect deadline, naming the address, and the tokenizer
    adds no advice about the corpus."""
    from flows.mirror import Mirror

    monkeypatch.setattr(dask_work, "CONNECT_TIMEOUT_S", 2)
    root, corpus = tmp_path / "art", inputs[1]
    shutil.copytree(Path(inputs[0]) / "corpus", root / "corpus")  # the corpus only: the tokenizer is to build
    outcome: dict = {}
    with Mirror({"/": b"not dask"}) as http:
        address = f"tcp://127.0.0.1:{http.port}"

        def build() -> None:
            try:
                stages.tokenizer(root, corpus, num_merges=64, bpe_train_bytes=60_000, run={"dask_address": address})
            except BaseException as e:
                outcome["error"] = e

        thread = threading.Thread(target=build, daemon=True)
        thread.start()
        thread.join(120)  # a hang guard, far above the 2 s deadline: the old client never returned
        assert not thread.is_alive(), "the stage hung on a port that is not a Dask scheduler"
    error = outcome.get("error")
    assert isinstance(error, dask_work.ClusterError), repr(error)
    assert str(error).startswith(f"dask_address {address}: no Dask scheduler answered within 2 s"), str(error)
    assert "corpus" not in str(error)
    assert not (root / "tokenizer").exists() or not [p for p in (root / "tokenizer").iterdir() if p.name[0] != "."]


def test_one_worker_local_cluster_listens_on_loopback_only_and_logs_no_dask_info(inputs, tmp_path, monkeypatch, caplog):
    """The tiny preset's cluster (one worker: threads in the stage's process) while the stage runs: every
    listening socket of the whole process tree on 127.0.0.1 (the worker's /health HTTP server was on 0.0.0.0
    and [::]); and none of distributed's INFO lines (cluster start and stop: a few dozen) in the log."""
    root, corpus, tokenizer = copy_inputs(inputs, tmp_path / "art")
    seen: list[str] = []
    ordered_results = dask_work.ordered_results

    def listening_then_work(*args, **kwargs):  # inside the stage, while its cluster is up
        me = psutil.Process()
        for p in [me, *me.children(recursive=True)]:
            seen.extend(
                f"{p.pid} {c.laddr.ip}:{c.laddr.port}"
                for c in p.net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN
            )
        return ordered_results(*args, **kwargs)

    monkeypatch.setattr(dask_work, "ordered_results", listening_then_work)
    caplog.set_level(logging.INFO)
    stages.shards(root, corpus, tokenizer, shard_tokens=SHARD, run={"workers": 1, "chunk_bytes": CHUNK})
    assert seen, "the stage ran no chunk work on its cluster"
    assert [s for s in seen if s.split()[1].rsplit(":", 1)[0] not in ("127.0.0.1", "::1")] == []
    chatter = [r for r in caplog.records if r.name.startswith("distributed") and r.levelno < logging.WARNING]
    assert [r.getMessage() for r in chatter] == []


# ---- an external cluster over TLS --------------------------------------------------------------------------
def make_certificates(tmp: Path, name: str) -> dict[str, str]:
    """A throwaway CA and one certificate it signs (for 127.0.0.1, client and server use), as Dask's TLS settings."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def pem_key(key) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    import ipaddress

    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), False)
        .sign(ca_key, hashes.SHA256())
    )
    files = {"ca-file": tmp / f"{name}-ca.pem", "client.cert": tmp / f"{name}.pem", "client.key": tmp / f"{name}.key"}
    files["ca-file"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files["client.cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files["client.key"].write_bytes(pem_key(key))
    files["client.key"].chmod(0o600)
    return {k: str(v) for k, v in files.items()}


def tls_settings(certs: dict[str, str]) -> dict[str, str]:
    return {f"distributed.comm.tls.{k}": v for k, v in certs.items()}


def test_external_cluster_over_tls_gives_the_same_shards_and_refuses_plain_clients(
    inputs, baseline, tmp_path, monkeypatch
):
    """A scheduler and a worker that speak only TLS with a throwaway CA: with Dask's TLS settings naming that CA
    and a certificate it signed, the shards stage gives the same bytes over tls://; a plain tcp:// client and a
    client whose certificate another CA signed are refused, each with one error naming the address."""
    import dask

    certs = make_certificates(tmp_path, "cluster")
    cluster = ExternalCluster(tmp_path, workers=1, tls=certs)
    try:
        assert cluster.address.startswith("tls://127.0.0.1:")
        assert loopback_only([p.pid for p in cluster.procs]) == []
        root, corpus, tokenizer = copy_inputs(inputs, tmp_path / "art")
        with dask.config.set(tls_settings(certs)):
            ref = stages.shards(
                root,
                corpus,
                tokenizer,
                shard_tokens=SHARD,
                run={"dask_address": cluster.address, "chunk_bytes": CHUNK},
            )
        assert ref["version"] == baseline["version"]
        assert manifest(ref)["files"] == manifest(baseline)["files"]

        monkeypatch.setattr(dask_work, "CONNECT_TIMEOUT_S", 3)
        plain = cluster.address.replace("tls://", "tcp://")
        with pytest.raises(dask_work.ClusterError) as refused:
            dask_work._connect(plain)
        assert str(refused.value).startswith(f"dask_address {plain}: could not talk to a Dask scheduler there (")
        assert "a scheduler that speaks TLS needs tls://host:port" in str(refused.value)
        strangers = tls_settings(make_certificates(tmp_path, "stranger"))  # a CA the cluster does not trust
        with (
            dask.config.set(strangers),
            pytest.raises(dask_work.ClusterError) as stranger,
        ):
            dask_work._connect(cluster.address)
        assert str(stranger.value).startswith(f"dask_address {cluster.address}: could not talk to a Dask scheduler")
        assert "TLS certificate" in str(stranger.value)
    finally:
        cluster.stop()


def test_an_external_cluster_with_no_shared_disk_reads_its_chunks_from_the_bucket(
    inputs, baseline, s3_root, s3_endpoint, tmp_path
):
    """With an s3:// root, the workers (started in a folder holding no artifacts, with only the AWS
    environment) read their byte ranges from the bucket, and the shards are the local root's, byte for byte."""
    from tasks.registry import open_store
    from tests.support.s3 import aws_env

    elsewhere = tmp_path / "worker-machine"
    elsewhere.mkdir()
    env = {**aws_env(s3_endpoint), "WIKI_PIPELINE_CACHE": str(elsewhere / "cache")}
    (tmp_path / "cluster").mkdir()
    cluster = ExternalCluster(tmp_path / "cluster", env=env, cwd=elsewhere)
    try:
        run = {"dask_address": cluster.address, "chunk_bytes": CHUNK}
        corpus = corpus_from_text(s3_root, tmp_path / "src", shared_splits())
        tokenizer = stages.tokenizer(s3_root, corpus, num_merges=64, bpe_train_bytes=60_000, run=run)
        ref = stages.shards(s3_root, corpus, tokenizer, shard_tokens=SHARD, run=run)
        store = open_store(s3_root)
        tok_files = store.get("tokenizer", tokenizer["version"]).manifest["files"]
        assert tok_files["tokenizer.json"] == manifest(inputs[2])["files"]["tokenizer.json"]  # stats.json has timings
        m = store.get("shards", ref["version"]).manifest
        assert m["files"] == manifest(baseline)["files"] and m["metrics"]["workers"] == 2
        with cluster.client() as c:  # each worker opened the bucket and read chunks from it
            assert list(c.run(lambda: sorted(dask_work._FILESYSTEMS)).values()) == [["s3"], ["s3"]]
        assert not [p for p in elsewhere.rglob("*") if p.suffix in (".txt", ".parquet", ".json")]
    finally:
        cluster.stop()
