"""Where an artifact root is (a directory or ``s3://bucket/prefix``), and its files."""

from __future__ import annotations

import os
import re
from pathlib import Path

from mygpt.errors import UserError
from tasks.store.files import Files
from tasks.store.layout import enclosing_root
from tasks.store.posix import PosixFiles
from tasks.store.s3 import ObjectFiles
from tasks.store.s3_urls import is_object_url, normal_url

ENV_ROOT = "WIKI_PIPELINE_ARTIFACTS"
REPO_ROOT = Path(__file__).resolve().parents[2]


def default_root() -> str:
    """``$WIKI_PIPELINE_ARTIFACTS`` if set, else ``artifacts/`` in the repository."""
    root = os.environ.get(ENV_ROOT, "").strip()
    if is_object_url(root):
        try:
            normal_url(root)
        except ValueError as exc:
            raise UserError(f"{ENV_ROOT}: {exc}") from None
    return root or str(REPO_ROOT / "artifacts")


def absolute_root(root: str | os.PathLike) -> str:
    """An artifact root as the store names it: an absolute path, or ``s3://bucket/prefix`` as written."""
    text = os.fspath(root)
    if not text.strip():  # not this process's working directory: nobody means it by leaving the root blank
        raise UserError(
            f"the artifact root is empty ({text!r}); give a directory or s3://bucket/prefix, or none for the "
            f"default (${ENV_ROOT}, else artifacts/ in the checkout)"
        )
    if is_object_url(text):
        try:
            return normal_url(text)
        except ValueError as exc:
            shown = re.sub(r"//[^/@]*@", "//***@", text).replace("\n", "\\n")  # never echo credentials
            raise UserError(f"artifact root {shown}: {exc}") from None
    if re.match(r"(?i)s3:(?!//)", text.strip()):
        raise UserError(f"artifact root {text}: an object-store root is written s3://bucket/prefix")
    return os.path.abspath(os.path.expanduser(text))


def open_files(root: str) -> Files:
    """The files of the root ``root`` (as :func:`absolute_root` names it); ``UserError`` for a missing bucket or
    a directory inside another root's stage folder or version."""
    if not is_object_url(root):
        inside = enclosing_root(Path(root))
        if inside is not None:
            raise UserError(
                f"artifact root {root} is inside {inside}: a root there would write into that root's versions; "
                "choose a directory outside it"
            )
        return PosixFiles(Path(root))
    files = ObjectFiles(root)
    files.check_bucket()  # not an empty listing or a wait
    return files
