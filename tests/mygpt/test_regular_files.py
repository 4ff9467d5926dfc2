"""The CLIs' files that are not regular files: ``--out``/``--output`` of ``mygpt tokenizer encode|train`` and
``mygpt train`` never replace a FIFO, a symbolic link (to a FIFO or a regular file) or ``/dev/stdout`` (one
``error:`` line, exit 2, the node kept); a device or a FIFO as TEXT is refused, not read without end."""

from __future__ import annotations

import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mygpt.cli import main
from mygpt.errors import UserError
from tests.support import REPO
from tests.support.tiny_model import flags

TRAIN = ["--device", "cpu", "--steps", "1", "--tokenizer", "char"]
TRAIN += flags(embed_dim=16, num_layers=1, num_heads=2, max_seq_len=16, seq_len=16, batch_size=2)


@pytest.fixture(scope="module")
def made(tmp_path_factory, shakespeare_text):
    """A text and a tokenizer.json trained on it."""
    d = tmp_path_factory.mktemp("regular")
    (d / "text.txt").write_text(shakespeare_text[:4_000], encoding="utf-8")
    assert main(["tokenizer", "train", str(d / "text.txt"), "--vocab-size", "270", "--out", str(d / "tok")]) == 0
    return d


def _one_error(capsys, argv, *fragments: str) -> None:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (argv, err)
    for fragment in fragments:
        assert fragment in lines[0], (argv, err)


def _nodes(tmp_path: Path) -> dict[Path, str]:
    """A FIFO and a symbolic link to it: what each must still be afterwards."""
    os.mkfifo(tmp_path / "fifo")
    os.symlink(tmp_path / "fifo", tmp_path / "link")
    return {tmp_path / "fifo": "fifo", tmp_path / "link": "link"}


def _still(nodes: dict[Path, str]) -> None:
    for path, kind in nodes.items():
        mode = os.lstat(path).st_mode
        assert stat.S_ISFIFO(mode) if kind == "fifo" else stat.S_ISLNK(mode), (path, oct(mode))
    assert [p.name for p in next(iter(nodes)).parent.iterdir() if p.name.startswith(".")] == []


def test_an_out_that_is_a_fifo_or_a_link_to_one_is_refused_and_kept(capsys, made, tmp_path):
    nodes = _nodes(tmp_path)
    kinds = {"fifo": "a FIFO (named pipe)", "link": "a symbolic link to a FIFO (named pipe)"}
    for out in nodes:
        _one_error(capsys, ["tokenizer", "encode", "--tokenizer", made / "tok" / "tokenizer.json", made / "text.txt",
                            "--out", out], f"--out {out} is {kinds[out.name]}, not a regular file")  # fmt: skip
        _one_error(capsys, ["train", made / "text.txt", *TRAIN, "--output", out],
                   f"--output {out} is {kinds[out.name]}, not a regular file")  # fmt: skip
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "dir" / "tokenizer.json")
    nodes[tmp_path / "dir" / "tokenizer.json"] = "fifo"
    _one_error(capsys, ["tokenizer", "train", made / "text.txt", "--vocab-size", 270, "--out", tmp_path / "dir"],
               "is a FIFO (named pipe), not a regular file")  # fmt: skip
    _still(nodes)


def test_an_out_that_is_a_link_to_a_regular_file_is_refused_and_neither_is_touched(capsys, made, tmp_path):
    """Replacing the link would lose it, following it would write where it points (anywhere a planted link aims)."""
    target = tmp_path / "ids.npy"
    target.write_bytes(b"old")
    os.symlink(target, tmp_path / "link.npy")
    tok = made / "tok" / "tokenizer.json"
    _one_error(capsys, ["tokenizer", "encode", "--tokenizer", tok, made / "text.txt", "--out", tmp_path / "link.npy"],
               f"--out {tmp_path / 'link.npy'} is a symbolic link to a regular file, not a regular file")  # fmt: skip
    assert os.path.islink(tmp_path / "link.npy") and target.read_bytes() == b"old"


def test_a_write_target_made_a_fifo_while_written_is_not_replaced(tmp_path):
    from mygpt.atomic import atomic_open

    target = tmp_path / "out.bin"
    with pytest.raises(UserError, match="is a FIFO"), atomic_open(target) as f:
        f.write(b"data")
        os.mkfifo(target)
    assert stat.S_ISFIFO(os.lstat(target).st_mode) and os.listdir(tmp_path) == ["out.bin"]


def _cli(*argv) -> subprocess.CompletedProcess:
    """``mygpt`` in a process of its own with 3 GiB of address space: reading a device without end fails fast."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    return subprocess.run([sys.executable, "-m", "mygpt.cli", *map(str, argv)], cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=120,
                          preexec_fn=limit)  # fmt: skip


def _one_line(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], proc.stderr


def test_a_device_or_a_fifo_as_text_is_refused_and_dev_stdout_as_out_too(made, tmp_path):
    tok = made / "tok" / "tokenizer.json"
    zero = "text file /dev/zero is a character device, not a regular file"
    _one_line(_cli("tokenizer", "train", "/dev/zero", "--vocab-size", 270, "--out", tmp_path / "t"), zero)
    _one_line(_cli("tokenizer", "encode", "--tokenizer", tok, "/dev/zero", "--out", tmp_path / "ids.npy"), zero)
    _one_line(_cli("train", "/dev/zero", *TRAIN, "--output", tmp_path / "m.ckpt"), zero)
    os.mkfifo(tmp_path / "fifo.txt")  # no writer: opening it to read would wait for one
    _one_line(_cli("tokenizer", "train", tmp_path / "fifo.txt", "--vocab-size", 270, "--out", tmp_path / "t"),
              f"text file {tmp_path / 'fifo.txt'} is a FIFO (named pipe)")  # fmt: skip
    # the child's stdout is the pipe capture_output made: /dev/stdout names it
    _one_line(_cli("tokenizer", "encode", "--tokenizer", tok, made / "text.txt", "--out", "/dev/stdout"),
              "--out /dev/stdout is a symbolic link to a FIFO (named pipe), not a regular file")  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo.txt"]
