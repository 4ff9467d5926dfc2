"""The settings a user chose on the command line (flows/choices.py): a setting given twice with two values, by a
flag and by --param/--params, is refused naming both, never silently overruled (scripts/pipeline --demo passes
--source-url for its mirror, so a --param corpus.source_url beside it was dropped and the demo text trained on)."""

from __future__ import annotations

import os
import subprocess

from flows.cli import main
from tests.support import REPO

MIRROR = "http://127.0.0.1:8765/wikitext-103-raw-v1.zip"


def test_a_flag_and_a_param_giving_one_setting_two_values_are_refused(capsys):
    code = main(["params", "--tiny", "--source-url", MIRROR, "--param", "corpus.source_url=file:///my.zip"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "corpus.source_url is given twice: 'file:///my.zip' by --param/--params" in err, err
    assert f"'{MIRROR}' by --source-url" in err and "run without --demo" in err, err
    code = main(["params", "--params", '{"corpus": {"source_url": "https://u:secret@example.org/w.zip"}}',
                 "--source-url", MIRROR])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "given twice" in err and "secret" not in err, err


def test_the_same_value_by_a_flag_and_a_param_is_taken(capsys):
    assert main(["params", "--source-url", MIRROR, "--param", f"source_url={MIRROR}"]) == 0
    assert MIRROR in capsys.readouterr().out


def test_the_demo_refuses_a_source_it_would_not_use_before_anything_starts(tmp_path):
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path / "home"),
        "PREFECT_API_URL": "http://127.0.0.1:9/api",  # never reached: the parameters are checked first
        "PYTHONPATH": str(REPO),  # this checkout's code, whichever checkout .venv was installed from
    }
    done = subprocess.run(
        [str(REPO / "scripts" / "pipeline"), "--demo", "--param", "corpus.source_url=file:///my.zip"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "error: corpus.source_url is given twice: 'file:///my.zip'" in done.stderr, done.stderr
    assert not (tmp_path / "home" / "mirror.pid").exists(), "no mirror started"
    assert "Completed" not in done.stdout


def test_one_setting_given_two_values_by_param_and_params_is_refused(capsys):
    assert main(["params", "--param", "model.steps=100", "--param", "model.steps=200"]) == 2
    assert "model.steps is given twice" in capsys.readouterr().err
    assert main(["params", "--params", '{"model": {"steps": 100}}', "--param", "model.steps=200"]) == 2
    assert "model.steps is given twice" in capsys.readouterr().err
