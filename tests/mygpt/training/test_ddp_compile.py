"""A compiled training run (TorchInductor, with the options ``mygpt.device.compile_options`` gives, the pipeline's
default for long runs) equals the eager one, in one process and in two real gloo processes; there the DDP module
is what is compiled (so DDP's graph splitting lets the all-reduce overlap the backward pass)."""

from __future__ import annotations

import pytest

from mygpt.device import compile_unavailable
from mygpt.training.launcher import run_training
from tests.mygpt.training.test_launcher import WORKER_ENV, assert_close_runs, files, make_job  # noqa: F401

#: 3 rows over 2 processes (2 + 1), micro-batches of 1 on rank 0: no_sync through the compiled module too
SHORT = dict(steps=4, batch_size=3, micro_batch_size=1, seq_len=32, lr=3e-3, print_every=1, eval_every=2,
             eval_batches=1, seed=3)  # fmt: skip


@pytest.mark.slow  # compiling forward and backward, in each process
@pytest.mark.parametrize("nproc", [1, 2])
def test_a_compiled_run_equals_the_eager_run(files, tmp_path, nproc):  # noqa: F811
    reason = compile_unavailable("cpu")
    if reason:
        pytest.skip(f"torch.compile cannot run on this machine: {reason}")
    lines: list[str] = []
    eager = run_training(make_job(files, tmp_path / "eager", **SHORT), nproc, log=None, env=WORKER_ENV)
    compiled = run_training(
        make_job(files, tmp_path / "compiled", **SHORT, compile=True), nproc, log=lines.append, env=WORKER_ENV
    )
    assert compiled.compiled and not eager.compiled and compiled.world_size == nproc
    assert not any(line.startswith("warning: ") for line in lines), lines
    assert_close_runs(tmp_path / "eager" / "train.ckpt", tmp_path / "compiled" / "train.ckpt")


def test_compile_is_applied_to_the_ddp_module_not_inside_it(monkeypatch, shakespeare_text):
    """With several processes, torch.compile gets the DDP wrapper (a stand-in here: one process posing as rank 0
    of two, its collectives answering alone)."""
    import torch

    from mygpt import GPT, CharTokenizer, TrainConfig
    from mygpt.training import train as train_mod
    from mygpt.training.parallel import World
    from tests.support.tiny_model import TINY_MODEL

    class PosingWorld(World):
        def all_gather(self, obj) -> list:
            return [obj] * self.size

        def all_reduce_sum(self, tensor):
            return tensor

    class Wrapper(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args, **kwargs):
            return self.inner(*args, **kwargs)

    compiled_what = []
    monkeypatch.setattr(train_mod, "compile_unavailable", lambda device, probe=False: None)
    monkeypatch.setattr(train_mod, "wrap_ddp", lambda model, device: Wrapper(model))
    monkeypatch.setattr(train_mod.torch, "compile", lambda module, **options: compiled_what.append(module) or module)
    text = shakespeare_text[:5000]
    tok = CharTokenizer.from_text(text)
    model = GPT(tok.vocab_size, **TINY_MODEL)
    config = TrainConfig(steps=1, batch_size=2, seq_len=32, print_every=0, compile=True)
    result = train_mod.train(model, tok, tok.encode_array(text), config=config, device="cpu", world=PosingWorld(size=2))
    assert result.compiled and len(compiled_what) == 1
    assert isinstance(compiled_what[0], Wrapper) and compiled_what[0].inner is model


def test_a_compiler_that_is_found_but_cannot_build_is_a_reason_when_probed(tmp_path):
    """A C++ compiler that answers for its version and fails every build (as g++ without Python's headers does):
    the quick check passes, the probe says why compile cannot run, so ``compile=auto`` trains eagerly."""
    import subprocess
    import sys

    from tests.support import REPO

    cxx = tmp_path / "g++"
    cxx.write_text(
        '#!/bin/sh\nfor a in "$@"; do [ "$a" = "--version" ] && exec g++ --version; done\n'
        'echo "fatal error: Python.h: No such file or directory" >&2\nexit 1\n'
    )
    cxx.chmod(0o755)
    code = "from mygpt.device import compile_unavailable as u; print(u('cpu')); print(u('cpu', probe=True))"
    env = {"PATH": "/usr/bin:/bin", "CXX": str(cxx), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    quick, probed = out.stdout.splitlines()[-2:]
    assert quick == "None"
    assert probed.startswith("torch.compile cannot build a kernel here (InductorError: CppCompileError"), probed
