"""Bad input for ``wiki-pipeline run --tiny``: the catalogue in ``bad_inputs.toml``, run in this process."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from string import Template

from flows.mirror import ZIP_NAME
from tasks.core.report import human_bytes
from tasks.registry import open_store
from tests.reliability.environment import env_vars
from tests.support import REPO, zips
from tests.support.http_servers import dripping_server

CATALOGUE = Path(__file__).with_name("bad_inputs.toml")


#: the special token a later split holds but the tiny preset's tokenizer slice does not (the shards refuse it)
LATE_SPECIAL = "( S"


def _late_special_tokenizer(tmp: Path) -> Path:
    """A real ``mygpt tokenizer train`` tokenizer.json with :data:`LATE_SPECIAL` added as a special token: taken by
    the tokenizer stage (its slice lacks it), refused by the shards, which read every split."""
    text = tmp / "tok-train.txt"
    text.write_text(" = A = \n the cat sat on the mat , and the dog sat on the log .\n" * 400, encoding="utf-8")
    out = tmp / "late-special"
    proc = subprocess.run(
        [sys.executable, "-m", "mygpt.cli", "tokenizer", "train", str(text), "--vocab-size", "300", "--out", str(out)],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"mygpt tokenizer train failed:\n{proc.stderr[-2000:]}")
    path = out / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["added_tokens"].append(
        {
            "id": max(t["id"] for t in data["added_tokens"]) + 1,
            "content": LATE_SPECIAL,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
    )
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _files(tmp: Path, url: str, drip: str) -> dict[str, str]:
    """The values the catalogue's ``${name}``s stand for, writing the files they name under ``tmp``."""
    afile = tmp / "a-file"
    afile.write_text("x")
    cores = os.cpu_count() or 1
    missing = tmp / "absent.zip"
    (tmp / "not-a.zip").write_bytes(b"<html>not a zip</html>")
    (tmp / "latin1.zip").write_bytes(
        zips.wikitext_zip({s: " caf\xe9 \n".encode("latin-1") if s == "train" else b" ok .\n" for s in zips.SPLITS})
    )
    (tmp / "encrypted.zip").write_bytes(zips.encrypted_zip())
    (tmp / "deflate64.zip").write_bytes(zips.deflate64_zip())
    fifo = tmp / "a-fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    bomb = tmp / "bomb.zip"
    bomb.write_bytes(zips.bomb_zip(30))
    with zipfile.ZipFile(bomb) as z:
        packed, declared = (sum(getattr(i, f) for i in z.infolist()) for f in ("compress_size", "file_size"))
    return {
        "url": url,
        "drip_zip": f"{drip}/{ZIP_NAME}",
        "drip_tokenizer": f"{drip}/tokenizer.json",
        "fifo": str(fifo),
        "late_special": str(_late_special_tokenizer(tmp)),
        "cores": str(cores),
        "more_cores": str(cores + 1),
        "afile": str(afile),
        "afile_sub": str(afile / "sub"),
        "missing": str(missing),
        "missing_uri": missing.as_uri(),
        **{f"{name}_uri": (tmp / f"{file}.zip").as_uri() for name, file in _ZIPS.items()},
        "bomb_packed": human_bytes(packed),
        "bomb_declared": human_bytes(declared),
        "bomb_ratio": f"{declared / packed:,.0f}",
    }


_ZIPS = {"notzip": "not-a", "latin1": "latin1", "encrypted": "encrypted", "deflate64": "deflate64", "bomb": "bomb"}


def bad_input_cases(tmp: Path, url: str, drip: str, *, with_flow: bool = True) -> list[dict]:
    """The catalogue's cases with their ``${name}``s filled in (``flow`` cases only ``with_flow``); ``drip`` is the
    address of a server that sends a byte now and then."""
    from tasks.registry import NAMES

    values = {**_files(tmp, url, drip), "stages": ", ".join(NAMES)}

    def fill(s: str) -> str:
        return Template(s).substitute(values)

    cases = tomllib.loads(CATALOGUE.read_text(encoding="utf-8"))["case"]
    return [
        {
            "args": [fill(a) for a in case["args"]],
            "env": {k: fill(v) for k, v in case.get("env", {}).items()},
            "error": fill(case["error"]) if "error" in case else None,
            "match": fill(case["match"]) if "match" in case else None,
            "may_publish": case.get("may_publish", []),
            "source_url": case.get("source_url", True),
        }
        for case in cases
        if with_flow or not case.get("flow")
    ]


def bad_inputs(tmp: Path, url: str, *, with_flow: bool = True) -> list[dict]:
    """Run ``wiki-pipeline run --tiny`` (``flows.cli.main``, in this process) with each bad input."""
    from flows.cli import main

    tmp = Path(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    rows = []
    with dripping_server(size=1_000_000, every=0.02) as drip:
        for i, case in enumerate(bad_input_cases(tmp, url, drip.url("").rstrip("/"), with_flow=with_flow)):
            rows.append(_one(main, tmp / f"bad-{i}", url, case))
    return rows


def _one(main, root: Path, url: str, case: dict) -> dict:
    """One case, run: its row. ``error`` is the exact line expected; ``match`` a regex it must match whole (for a
    line that holds what varies, like how many bytes came before a deadline); ``source_url = false`` runs it
    without the mirror's URL, which is otherwise added (a case about a missing source)."""
    args, want, environment = case["args"], case["error"], case["env"]
    argv = ["run", "--tiny", *args]
    if "--artifacts-dir" not in args:
        argv += ["--artifacts-dir", str(root)]
    if case["source_url"] and not any(a in ("--source-url", "--mirror") for a in args):
        argv += ["--source-url", url]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), env_vars(**environment):
        code = main(argv)
    lines = [line for line in err.getvalue().splitlines() if line.startswith("error: ")]
    got = lines[-1] if lines else err.getvalue().strip()[-300:]
    nothing = not [v for v in open_store(root).versions() if v.stage not in case["may_publish"]]
    shown = [f"{k}={v}" for k, v in environment.items()] + args
    exact = (want is None or got == want) and (case["match"] is None or bool(re.fullmatch(case["match"], got)))
    traceback = "Traceback" in err.getvalue()
    return {
        "input": " ".join(shown),
        "code": code,
        "message": got,
        "exact": exact,
        "error_lines": len(lines),
        "nothing_published": nothing,
        "traceback": traceback,
        "ok": code == 2 and exact and len(lines) == 1 and nothing and not traceback,
    }
