"""A full disk while a stage runs: one user error naming the stage, the path and the space left there, nothing
published. The artifact root is a small tmpfs (mounted as root;
skipped where mounting is not allowed)."""

from __future__ import annotations

import errno
import shutil

import pytest

from flows.settings import TINY, Pipeline
from mygpt.errors import UserError
from tasks.core.disk_full import disk_full_named
from tasks.core.report import human_bytes
from tasks.registry import BY_NAME
from tests.support.small_disk import small_disk
from tests.support.tiny import run_in, tiny_zip_url


@pytest.fixture
def disk(tmp_path):
    """A 1 MiB tmpfs at ``tmp_path/disk``."""
    with small_disk(tmp_path / "disk") as where:
        yield where


def test_a_full_disk_names_the_stage_the_path_and_the_space_left(disk, tmp_path):
    settings = Pipeline.parse(**{**TINY, "corpus": {"source_url": tiny_zip_url(tmp_path)}}).resolved("corpus")
    with pytest.raises(UserError) as full:  # the zip's 1.1 MB of text, unzipped and joined, do not fit 1 MiB
        BY_NAME["corpus"].task.fn(settings, run_in(disk))
    message = str(full.value)
    assert message.startswith(f"corpus: no space left on the device writing {disk}"), message
    assert f"(a filesystem of {human_bytes(shutil.disk_usage(disk).total)}, " in message, message
    assert " free now)" in message, message
    assert "wiki-pipeline gc --yes" in message and "--artifacts-dir" in message
    assert list(disk.glob("corpus/*/manifest.json")) == []  # nothing published


def test_only_a_no_space_error_becomes_a_user_error(tmp_path):
    quota = pytest.raises(UserError, match=r"^shards: no space left on the device writing /x/y[ ;]")
    with quota, disk_full_named("shards", str(tmp_path)):
        raise OSError(errno.EDQUOT, "Disk quota exceeded", "/x/y")
    with pytest.raises(PermissionError), disk_full_named("shards", str(tmp_path)):
        raise PermissionError(errno.EACCES, "Permission denied", "/x/y")
