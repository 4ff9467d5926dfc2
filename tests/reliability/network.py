"""Network faults and changes at the source URL, against the corpus stage in this process."""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from flows.mirror import ZIP_NAME, Mirror
from tasks.registry import open_store
from tasks.store import MANIFEST
from tests.reliability.digests import stage_digests
from tests.reliability.environment import captured_logs, env_vars
from tests.support.mirror_faults import FaultyMirror
from tests.support.zips import SPLITS, wikitext_zip


@dataclass
class NetCase:
    name: str
    faults: dict
    expect: str  # "corpus" or a regex of the UserError
    kwargs: dict = field(default_factory=dict)
    serve: bytes | None = None  # serve these bytes instead of the real zip


def network_cases(zip_bytes: bytes) -> list[NetCase]:
    """The cases; a fault meant for the download is set for 2 responses, the first being the probe."""
    size = len(zip_bytes)
    sha = hashlib.sha256(zip_bytes).hexdigest()
    other = wikitext_zip({"train": " = A = \n not the corpus .\n"})
    flipped = bytearray(zip_bytes)
    flipped[size // 2] ^= 0xFF
    return [
        NetCase("503, 503, then 200", {"fail_first": 2}, "corpus"),
        NetCase("connection dropped after 100 kB", {"drop_after": 100_000, "drop_times": 2}, "corpus"),
        NetCase(
            "dropped, and Range ignored (200 + whole file)",
            {"drop_after": 100_000, "drop_times": 2, "ignore_range": True},
            "corpus",
        ),
        NetCase(
            "Content-Length 5000 too large (the probed size is read, not more)",
            {"length_delta": 5000, "length_times": 2},
            "corpus",
        ),
        NetCase(
            "Content-Length 5000 too small (body cut short; the rest comes with Range)",
            {"length_delta": -5000, "length_times": 2},
            "corpus",
        ),
        NetCase(
            "Content-Length 5000 too small, expected_bytes given",
            {"length_delta": -5000, "length_times": 2},
            "corpus",
            {"expected_bytes": size},
        ),
        NetCase(
            "a different file (size differs from expected_bytes: refused before downloading)",
            {},
            r"is [\d,]+ bytes but expected_bytes is",
            {"expected_bytes": size},
            other,
        ),
        NetCase(
            "a larger file than expected_bytes (refused before downloading)",
            {},
            r"is [\d,]+ bytes but expected_bytes is",
            {"expected_bytes": size},
            zip_bytes + b"\0" * 100_000,
        ),
        NetCase(
            "one byte flipped (sha256 differs from expected_sha256)",
            {},
            r"has sha256 [0-9a-f]{64} but "
            r"expected_sha256 is " + sha,
            {"expected_sha256": sha},
            bytes(flipped),
        ),
        NetCase("404", {"not_found": True}, r"HTTP 404 Not Found; the file is not there: check source_url"),
        NetCase(
            "stall 4 s after 64 KiB (read timeout 1 s)",
            {"stall": 4.0, "stall_after": 65536, "stall_times": 2},
            "corpus",
        ),
        NetCase("502 forever", {"fail_first": 10_000, "fail_status": 502}, r"failed 3 times in a row \(last: HTTP 502"),
    ]


def _cached_zip_problem(root: Path, zip_bytes: bytes) -> str | None:
    """A cached (part of a) zip in download staging that is not a prefix of the real zip."""
    for p in (root / "corpus" / ".staging").glob("*/work/source.zip*"):
        if p.suffix == ".json":
            continue
        data = p.read_bytes()
        if not zip_bytes.startswith(data) or (p.name == "source.zip" and data != zip_bytes):
            what = "the" if p.name == "source.zip" else "a prefix of the"
            return f"{p.relative_to(root)} ({len(data):,} B) is not {what} real zip"
    return None


def network_faults(workdir: Path, zip_bytes: bytes, reference_corpus: dict) -> list[dict]:
    """Each network case against a fresh root; then a healthy rerun on the same root must give the corpus."""
    from mygpt.errors import UserError
    from tasks.sources.download import ENV_ATTEMPTS, ENV_BASE_DELAY, ENV_READ_TIMEOUT
    from tests.support.stages import corpus as download

    rows = []
    for i, case in enumerate(network_cases(zip_bytes)):
        root = Path(workdir) / f"net-{i}"
        data = case.serve if case.serve is not None else zip_bytes
        row = {"case": case.name, "expect": "corpus" if case.expect == "corpus" else "clear error"}
        with (
            FaultyMirror({"/" + ZIP_NAME: data}) as m,
            env_vars(**{ENV_BASE_DELAY: 0.01, ENV_ATTEMPTS: 3, ENV_READ_TIMEOUT: 1.0}),
        ):
            m.set_faults(**case.faults)
            t0 = time.monotonic()
            try:
                ref = download(root, source_url=m.url(), **case.kwargs)
                m_ = json.loads((Path(ref["path"]) / MANIFEST).read_text())["metrics"]["download"]
                row["outcome"] = "corpus"
                row["detail"] = f"{m_['tries']} request(s), {m_['range_requests']} with Range"
                good = stage_digests(root, "corpus") == reference_corpus
                row["handled"] = case.expect == "corpus" and good
                if not good:
                    row["detail"] += "; CORPUS DIFFERS"
            except UserError as e:
                row["outcome"] = "error"
                row["detail"] = str(e)
                row["handled"] = case.expect != "corpus" and bool(re.search(case.expect, str(e)))
                if open_store(root).versions():
                    row["handled"] = False
                    row["detail"] += "; SOMETHING WAS PUBLISHED"
            row["seconds"] = round(time.monotonic() - t0, 2)
            row["statuses"] = _statuses(m)
            bad = _cached_zip_problem(root, zip_bytes)
            if bad:
                row["handled"] = False
                row["detail"] += f"; CORRUPT CACHE: {bad}"
        if row["outcome"] == "error":  # the same root with a healthy server: must not reuse anything bad
            with Mirror({"/" + ZIP_NAME: zip_bytes}) as healthy, env_vars(**{ENV_BASE_DELAY: 0.01}):
                try:
                    download(
                        root,
                        source_url=healthy.url(),
                        **{k: v for k, v in case.kwargs.items() if k != "expected_sha256" or case.serve is None},
                    )
                    row["rerun"] = "corpus" if stage_digests(root, "corpus") == reference_corpus else "WRONG CORPUS"
                except UserError as e:
                    row["rerun"] = f"error: {e}"
            # a rerun at another URL is another version: what matters is that it is correct
            row["handled"] = row["handled"] and row["rerun"] == "corpus"
        rows.append(row)
    return rows


SECRETS = ("S3CRET", "T0KEN-abc")


def source_cases(workdir: Path, zip_bytes: bytes, reference_corpus: dict) -> list[dict]:
    """New content at the same URL gives a new version; credentials in the URL are stored nowhere."""
    from tasks.core.urls import redact_url
    from tests.support.stages import corpus as download

    rows = []
    other = wikitext_zip({s: f" = New {s} = \n new text .\n" for s in SPLITS})
    root = Path(workdir) / "changed"
    with Mirror({"/" + ZIP_NAME: zip_bytes}) as m:
        first = download(root, source_url=m.url())
        m.add("/" + ZIP_NAME, other)
        second = download(root, source_url=m.url())
        text = (Path(second["path"]) / "wiki.train.txt").read_text()
        handled = (
            second["version"] != first["version"]
            and "new text" in text
            and stage_digests(root, "corpus", first["version"]) == reference_corpus
        )
        rows.append(
            {
                "case": "same URL, new content (the mirror swaps the zip between two runs)",
                "expect": "new version",
                "outcome": "new version" if second["version"] != first["version"] else "OLD VERSION REUSED",
                "handled": handled,
                "statuses": _statuses(m),
                "detail": f"corpus/{first['version']} then corpus/{second['version']} (the new text); the old "
                "version is kept",
            }
        )
    root = Path(workdir) / "credentials"
    with Mirror({"/" + ZIP_NAME: zip_bytes}) as m, captured_logs() as lines:
        url = f"http://alice:S3CRET@127.0.0.1:{m.port}/{ZIP_NAME}?token=T0KEN-abc"
        download(root, source_url=url)
        stored = "\n".join([*lines, *(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())])
        leaked = [secret for secret in SECRETS if secret in stored]
        good = stage_digests(root, "corpus") == reference_corpus
        rows.append(
            {
                "case": "credentials in source_url (user:password@host, ?token=)",
                "expect": "corpus",
                "outcome": "corpus" if good else "CORPUS DIFFERS",
                "handled": good and not leaked,
                "statuses": _statuses(m),
                "detail": f"shown and stored as {redact_url(url)}" + (f"; LEAKED: {leaked}" if leaked else ""),
            }
        )
    return rows


def _statuses(m: Mirror) -> str:
    return " ".join(str(r["status"]) + (f"({r['range']})" if r["range"] else "") for r in m.requests[:6]) + (
        " ..." if len(m.requests) > 6 else ""
    )
