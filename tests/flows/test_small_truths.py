"""`mygpt train` is never silent for long and says what clipping does; `scripts/pipeline` names a busy port and stops
what it started."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys

import pytest

from mygpt.cli import main
from tests.support import REPO

TINY = ["--embed-dim", "32", "--num-layers", "1", "--num-heads", "4", "--max-seq-len", "32", "--seq-len", "32"]


def test_mygpt_train_prints_every_tenth_of_the_steps_by_default(capsys, shakespeare_text, tmp_path):
    text = tmp_path / "small.txt"
    text.write_text(shakespeare_text[:20_000], encoding="utf-8")
    argv = ["train", str(text), *TINY, "--batch-size", "4", "--device", "cpu", "--steps", "30"]
    assert main([*argv, "--output", str(tmp_path / "m.ckpt")]) == 0
    lines = capsys.readouterr().out.splitlines()
    steps = [line.split(":")[0] for line in lines if line.startswith("step ")]
    assert steps == ["step 1", *(f"step {n}" for n in range(3, 31, 3))], lines
    assert "max_grad_norm: 0.0 (no clipping)" in lines


def test_mygpt_train_help_names_print_every():
    done = subprocess.run(
        [sys.executable, "-m", "mygpt.cli", "train", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert "--print-every" in done.stdout and "10%" in done.stdout, done.stdout


def test_the_demo_names_a_busy_mirror_port_and_how_to_pick_another(tmp_path):
    """A taken mirror port: one line naming it and the variable that moves it, nothing started; a non-number refused."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {
            **os.environ,
            "WIKI_PIPELINE_MIRROR_PORT": str(port),
            "PREFECT_HOME": str(tmp_path / "home"),
            "PREFECT_API_URL": "http://127.0.0.1:9/api",  # never reached: the mirror comes first
        }
        done = subprocess.run(
            [str(REPO / "scripts" / "pipeline"), "--demo"], env=env, capture_output=True, text=True, timeout=300
        )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"error: port {port} on 127.0.0.1 is in use by another program" in done.stderr, done.stderr
    assert "WIKI_PIPELINE_MIRROR_PORT=" in done.stderr and "Prefect server" not in done.stdout, done.stdout
    assert not (tmp_path / "home" / "mirror.pid").exists()

    del env["PREFECT_API_URL"]  # the script would start a server on 4200: these are refused before anything starts
    for bad in ("87x", "", "08765", "99999999999999999999", "80", "4200"):
        env |= {"WIKI_PIPELINE_MIRROR_PORT": bad, "WIKI_PIPELINE_PREFECT_PORT": "4200"}
        done = subprocess.run(
            [str(REPO / "scripts" / "pipeline"), "--demo"], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 2, (bad, done.stdout, done.stderr)
        assert f"WIKI_PIPELINE_MIRROR_PORT='{bad}' is not a port the demo's mirror can use" in done.stderr, done.stderr
    env["WIKI_PIPELINE_PREFECT_PORT"] = "0x"
    done = subprocess.run(
        [str(REPO / "scripts" / "pipeline"), "--demo"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2 and "WIKI_PIPELINE_PREFECT_PORT='0x' is not a port" in done.stderr, done.stderr
    assert not (tmp_path / "home" / "server.pid").exists(), "no server started"
    done = subprocess.run([str(REPO / "scripts" / "pipeline"), "--stop"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, "--stop runs whatever the ports say"


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def test_stop_leaves_a_process_that_only_reuses_a_recorded_pid(tmp_path):
    """`--stop` signals a recorded pid only if its start time and command line match the pid file's."""
    import psutil

    home = tmp_path / "home"
    home.mkdir()
    stranger = subprocess.Popen(["bash", "-c", 'exec -a "python -m flows.mirror --serve --port 1" sleep 300'])
    try:
        (home / "mirror.pid").write_text(f"{stranger.pid} Mon Jan 1 00:00:00 2024\n")  # another start time
        env = {**os.environ, "PREFECT_HOME": str(home)}
        done = subprocess.run([str(REPO / "scripts" / "pipeline"), "--stop"], env=env, capture_output=True, text=True)
        assert done.returncode == 0 and "stopped" not in done.stdout, done.stdout
        assert psutil.Process(stranger.pid).status() != psutil.STATUS_ZOMBIE and stranger.poll() is None
        assert not (home / "mirror.pid").exists(), "the stale pid file is gone"
        started = subprocess.run(["ps", "-o", "lstart=", "-p", str(stranger.pid)], capture_output=True, text=True)
        (home / "mirror.pid").write_text(f"{stranger.pid} {' '.join(started.stdout.split())}\n")  # the very process
        done = subprocess.run([str(REPO / "scripts" / "pipeline"), "--stop"], env=env, capture_output=True, text=True)
        assert f"stopped the mirror (pid {stranger.pid})" in done.stdout, done.stdout + done.stderr
        assert stranger.wait(timeout=30) is not None
    finally:
        stranger.kill()
        stranger.wait()


@pytest.fixture(scope="module")
def demo(prefect_server, tmp_path_factory):
    """`scripts/pipeline --demo` four times on one PREFECT_HOME: a whole run that waits (artifact root art1, which
    holds a decoy samples folder), then two calls that restart the runner, for another artifact root (art2, a run
    that waits) and then for MYGPT_DETERMINISTIC (`--no-wait`); the third call's run trains 100,000 steps, so it is
    still in flight for a fourth call, under another allow-list, which must not restart the runner under it, and
    for `--stop`. One runner, mirror and pipeline run shared by the tests below, as a user calls the script;
    stopped at the end, whatever happened."""
    import time

    from flows.server import free_port

    tmp = tmp_path_factory.mktemp("demo")
    home = tmp / "home"
    decoy = tmp / "art1" / "samples" / "decoy"
    decoy.mkdir(parents=True)
    (decoy / "samples.md").write_text("DECOY SAMPLES\n")
    future = time.time() + 3600
    os.utime(decoy, (future, future))  # the most recently modified samples folder, yet no run's
    env = {
        **os.environ,
        **prefect_server.env,
        "PREFECT_HOME": str(home),
        "WIKI_PIPELINE_MIRROR_PORT": str(mirror_port := free_port()),
        "WIKI_PIPELINE_ARTIFACTS": str(tmp / "art1"),
    }
    script = str(REPO / "scripts" / "pipeline")
    calls: dict = {"home": home, "tmp": tmp, "env": env, "script": script}
    try:
        calls["first"] = subprocess.run([script, "--demo"], env=env, capture_output=True, text=True, timeout=480)
        env = {**env, "WIKI_PIPELINE_ARTIFACTS": str(tmp / "art2")}
        second = subprocess.run([script, "--demo"], env=env, capture_output=True, text=True, timeout=480)
        calls["second"] = second
        if (home / "runner.env").exists():  # what the second call recorded, before the third records again
            calls["runner.env"] = ((home / "runner.env").read_text(), (home / "runner.env").stat().st_mode)
        env = {**env, "MYGPT_DETERMINISTIC": "1"}  # the library's own switches reach a run through the runner too
        calls["third"] = subprocess.run(
            [script, "--demo", "--no-wait", "--param", "steps=100000", "--param", "compile=false"],  # a long run, eager
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        calls["env"] = env
        from tests.support.wait import wait_for

        log = home / "runner.log"
        wait_for(lambda: "step 10: loss" in log.read_text().rpartition("---- wiki-pipeline serve")[2], "training",
                 timeout=180, every=0.5)  # fmt: skip
        calls["fourth"] = subprocess.run(
            [script, "--demo", "--no-wait"],
            env={**env, "WIKI_PIPELINE_ALLOWED_SOURCES": f"http://127.0.0.1:{mirror_port}/ file:///srv/tokenizers/"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        yield calls
    finally:
        subprocess.run([script, "--stop"], env=env, capture_output=True, text=True, timeout=120)


def test_the_demo_prints_this_runs_samples_and_restarts_a_runner_with_another_environment(demo):
    """scripts/pipeline shows the samples version its own run named (not the newest folder), prints the
    PREFECT_API_URL line only for a server it runs itself, and restarts a runner started under another artifact
    root rather than let it serve this call, without writing the environment's values anywhere."""
    first = demo["first"]
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    named = [w for line in first.stdout.splitlines() if line.startswith("  samples ") for w in line.split()[2:3]]
    assert named and named[-1].startswith("samples/"), first.stdout
    assert f"this run's samples ({named[-1]}):" in first.stdout and "DECOY" not in first.stdout, first.stdout
    assert "export PREFECT_API_URL" not in first.stdout, "the URL the user set is theirs: not echoed"

    second = demo["second"]
    assert second.returncode == 0, second.stdout + second.stderr
    assert "restarting the deployment runner: its environment differs in WIKI_PIPELINE_ARTIFACTS" in second.stdout
    assert "reusing the deployment runner" not in second.stdout, second.stdout
    assert "runner.env" in demo, "the second call recorded no runner.env"
    recorded, mode = demo["runner.env"]
    assert "WIKI_PIPELINE_ARTIFACTS=" in recorded and str(demo["tmp"] / "art2") not in recorded, recorded
    assert mode & 0o077 == 0

    third = demo["third"]
    assert third.returncode == 0, third.stdout + third.stderr
    assert "restarting the deployment runner: its environment differs in MYGPT_DETERMINISTIC" in third.stdout


def test_a_runner_serving_a_run_is_not_restarted_under_it(demo):
    """Another allow-list while the runner trains a run: the call is refused, naming the run and the ways out; the
    runner and its run go on (test_stop_ends_the_runner_and_a_run_in_flight finds them)."""
    fourth = demo["fourth"]
    assert fourth.returncode == 2, fourth.stdout + fourth.stderr
    assert "error: the deployment runner must restart (its environment differs in WIKI_PIPELINE_ALLOWED_SOURCES)" in (
        fourth.stderr
    ), fourth.stderr
    assert "scripts/pipeline --stop" in fourth.stderr and "restarting the deployment runner" not in fourth.stdout


def test_stop_ends_the_runner_and_a_run_in_flight(demo):
    """`--stop` while a demo run trains: the runner, the run's process and what it started all end."""
    import psutil

    from tests.support.wait import wait_for

    home, env, script = demo["home"], demo["env"], demo["script"]
    assert demo["third"].returncode == 0, demo["third"].stdout + demo["third"].stderr
    runner = psutil.Process(int((home / "runner.pid").read_text().split()[0]))
    mirror = psutil.Process(int((home / "mirror.pid").read_text().split()[0]))
    log = home / "runner.log"  # appended to by each runner: the last one's part is the run in flight's
    in_flight = lambda: log.read_text().rpartition("---- wiki-pipeline serve")[2]  # noqa: E731
    wait_for(lambda: "step 10: loss" in in_flight(), "the demo run's training", timeout=180, every=0.5)
    group = [p for p in psutil.process_iter() if _pgid(p.pid) == runner.pid]
    assert len(group) >= 3, "the runner, the run's process and what it started"

    try:
        stopped = subprocess.run([script, "--stop"], env=env, capture_output=True, text=True, timeout=120)
        assert stopped.returncode == 0 and "stopped the runner" in stopped.stdout, stopped.stdout + stopped.stderr
        _, alive = psutil.wait_procs([*group, mirror], timeout=30)
        assert not alive, [p.cmdline() for p in alive]
        assert not (home / "runner.pid").exists() and not (home / "mirror.pid").exists()
    finally:  # nothing of it outlives the test, whatever happened
        for p in [*group, mirror]:
            with contextlib.suppress(psutil.Error):
                p.kill()


def test_run_mirror_serves_on_the_port_the_environment_names(monkeypatch):
    """`wiki-pipeline run --mirror` honours WIKI_PIPELINE_MIRROR_PORT as `scripts/pipeline --demo` does: it serves
    there, refuses a value that is no port, and says so when the port it was told to use is taken."""
    import pytest
    import requests

    from flows.run_commands import loopback_mirror
    from flows.server import free_port
    from mygpt.errors import UserError

    port = free_port()
    monkeypatch.setenv("WIKI_PIPELINE_MIRROR_PORT", str(port))
    with loopback_mirror() as url:
        assert url.startswith(f"http://127.0.0.1:{port}/")
        assert requests.head(url, timeout=10).status_code == 200
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        with pytest.raises(UserError, match=f"WIKI_PIPELINE_MIRROR_PORT={port}: that port"), loopback_mirror():
            pass
    for bad in ("80", "x", "99999"):
        monkeypatch.setenv("WIKI_PIPELINE_MIRROR_PORT", bad)
        with pytest.raises(UserError, match="is not a port the mirror can use"), loopback_mirror():
            pass
