"""Bad input for ``wiki-pipeline run --tiny``: the catalogue in ``bad_inputs.toml``, run in this process."""

from __future__ import annotations

import contextlib
import io
import os
import tomllib
import zipfile
from pathlib import Path
from string import Template

from flows.mirror import make_zip
from tasks.core.report import human_bytes
from tasks.registry import open_store
from tests.reliability.environment import env_vars
from tests.support import zips

CATALOGUE = Path(__file__).with_name("bad_inputs.toml")


def _files(tmp: Path, url: str) -> dict[str, str]:
    """The values the catalogue's ``${name}``s stand for, writing the files they name under ``tmp``."""
    afile = tmp / "a-file"
    afile.write_text("x")
    cores = os.cpu_count() or 1
    missing = tmp / "absent.zip"
    (tmp / "not-a.zip").write_bytes(b"<html>not a zip</html>")
    (tmp / "latin1.zip").write_bytes(
        make_zip(
            {
                f"wikitext-103-raw/wiki.{s}.raw": (" caf\xe9 \n".encode("latin-1") if s == "train" else b" ok .\n")
                for s in ("train", "valid", "test")
            }
        )
    )
    (tmp / "encrypted.zip").write_bytes(zips.encrypted_zip())
    (tmp / "deflate64.zip").write_bytes(zips.deflate64_zip())
    bomb = tmp / "bomb.zip"
    bomb.write_bytes(zips.bomb_zip(30))
    with zipfile.ZipFile(bomb) as z:
        packed, declared = (sum(getattr(i, f) for i in z.infolist()) for f in ("compress_size", "file_size"))
    return {
        "url": url,
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


def bad_input_cases(tmp: Path, url: str, *, with_flow: bool = True) -> list[dict]:
    """The catalogue's cases with their ``${name}``s filled in (``flow`` cases only ``with_flow``)."""
    from tasks.registry import NAMES

    values = {**_files(tmp, url), "stages": ", ".join(NAMES)}

    def fill(s: str) -> str:
        return Template(s).substitute(values)

    cases = tomllib.loads(CATALOGUE.read_text(encoding="utf-8"))["case"]
    return [
        {
            "args": [fill(a) for a in case["args"]],
            "env": {k: fill(v) for k, v in case.get("env", {}).items()},
            "error": fill(case["error"]) if "error" in case else None,
            "may_publish": case.get("may_publish", []),
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
    for i, case in enumerate(bad_input_cases(tmp, url, with_flow=with_flow)):
        args, want, environment = case["args"], case["error"], case["env"]
        root = tmp / f"bad-{i}"
        argv = ["run", "--tiny", *args]
        if "--artifacts-dir" not in args:
            argv += ["--artifacts-dir", str(root)]
        if not any(a in ("--source-url", "--mirror") for a in args):
            argv += ["--source-url", url]
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), env_vars(**environment):
            code = main(argv)
        lines = [line for line in err.getvalue().splitlines() if line.startswith("error: ")]
        got = lines[-1] if lines else err.getvalue().strip()[-300:]
        nothing = not [v for v in open_store(root).versions() if v.stage not in case["may_publish"]]
        shown = [f"{k}={v}" for k, v in environment.items()] + args
        rows.append(
            {
                "input": " ".join(shown),
                "code": code,
                "message": got,
                "exact": want is None or got == want,
                "nothing_published": nothing,
                "traceback": "Traceback" in err.getvalue(),
                "ok": code == 2 and (want is None or got == want) and nothing and "Traceback" not in err.getvalue(),
            }
        )
    return rows
