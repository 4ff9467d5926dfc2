"""mygpt.limits: the settings-time checks and the torch-free answer "this runs on the CPU", each fast path proven
equal to the plain one (mygpt.device, which asks torch)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from mygpt import device as torch_device
from mygpt import limits
from mygpt.errors import UserError
from tests.support import REPO

DEVICE_NAMES = ["cpu", " CPU ", "auto", "AUTO", "", "mps", "cuda", "cuda:0", "tpu"]
PRECISIONS = ["auto", "fp32", "bf16", " BF16 ", "", "fp16", "half"]


def torch_answer(name: str) -> torch.device | str:
    """mygpt.device.resolve_device's answer, or its error message."""
    try:
        return torch_device.resolve_device(name)
    except UserError as e:
        return str(e)


@pytest.mark.parametrize("name", DEVICE_NAMES)
def test_resolves_to_cpu_only_where_torch_says_cpu(name):
    if limits.resolves_to_cpu(name):
        assert torch_answer(name) == torch.device("cpu")


def test_auto_is_answered_without_torch_exactly_where_nothing_but_the_cpu_can_be():
    """On Linux with no accelerator device node the fast path answers "auto" (and torch agrees: cpu); with a node
    (an NVIDIA, ROCm or WSL GPU) it leaves the answer to torch."""
    fast = limits.resolves_to_cpu("auto")
    if sys.platform.startswith("linux") and not fast:
        pytest.skip("this machine has an accelerator device node: 'auto' is torch's to answer here")
    if not sys.platform.startswith("linux"):
        assert not fast, "only Linux is answered without torch"
        return
    assert fast and torch_answer("auto") == torch.device("cpu")
    assert not torch.cuda.is_available()


@pytest.mark.parametrize("node", ["nvidia0", "nvidiactl", "nvidia-uvm", "kfd", "dxg"])
def test_an_accelerator_device_node_leaves_auto_to_torch(tmp_path, monkeypatch, node):
    monkeypatch.setattr(sys, "platform", "linux")
    for harmless in ("null", "zero", "tty", "dri"):
        (tmp_path / harmless).touch()
    assert limits.resolves_to_cpu("auto", dev=str(tmp_path)), "no accelerator node: the CPU"
    (tmp_path / node).touch()
    assert not limits.resolves_to_cpu("auto", dev=str(tmp_path))
    assert limits.resolves_to_cpu("cpu", dev=str(tmp_path)), "cpu is the CPU wherever it runs"


@pytest.mark.parametrize("platform", ["darwin", "win32", "freebsd14"])
def test_auto_off_linux_is_torchs_to_answer(tmp_path, monkeypatch, platform):
    monkeypatch.setattr(sys, "platform", platform)
    assert not limits.resolves_to_cpu("auto", dev=str(tmp_path)), "macOS may have MPS; elsewhere: ask torch"
    assert limits.resolves_to_cpu("cpu", dev=str(tmp_path))


@pytest.mark.parametrize("precision", PRECISIONS)
def test_cpu_precision_equals_resolve_precision_on_the_cpu(precision):
    def answer(resolve):
        try:
            return resolve()
        except UserError as e:
            return f"UserError: {e}"

    fast = answer(lambda: limits.cpu_precision(precision))
    assert fast == answer(lambda: torch_device.resolve_precision(torch.device("cpu"), precision))
    assert fast == answer(lambda: torch_device.resolve_precision("cpu", precision))


@pytest.mark.parametrize("device", ["auto", "cpu"])
@pytest.mark.parametrize("precision", ["auto", "fp32", "bf16"])
def test_device_settings_resolve_as_torch_does(device, precision):
    """The settings' torch-free path gives what the torch path gives (``DeviceSettings.resolved``)."""
    from tasks.model import ModelSettings
    from tasks.samples import SamplesSettings

    want_device = torch_device.resolve_device(device)
    want = (str(want_device), torch_device.resolve_precision(want_device, precision))
    for cls in (ModelSettings, SamplesSettings):
        s = cls(device=device, precision=precision).resolved()
        assert (s.device, s.precision) == want


@pytest.mark.parametrize("nproc", ["auto", 1, 2, "2", " AUTO "])
@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_resolve_nproc_answers_as_with_torchs_device(nproc, device, monkeypatch):
    from mygpt.training import launcher

    fast = launcher.resolve_nproc(nproc, device)
    monkeypatch.setattr(limits, "resolves_to_cpu", lambda device, dev="/dev": False)  # the plain path: torch
    assert launcher.resolve_nproc(nproc, device) == fast


def test_checking_settings_loads_no_torch():
    """The checks, the config and the CPU answer run in a process that never imports torch."""
    code = """
import sys
from mygpt.gpt_config import GPTConfig
from tests.support.tiny_model import CH28_MODEL
from mygpt.limits import check_memory, check_nproc, check_seq_len, cpu_precision, resolves_to_cpu
from mygpt.training.launcher import resolve_nproc
config = GPTConfig(**{**CH28_MODEL, "vocab_size": 2})
check_seq_len(256, 256); check_nproc(16, 1); check_memory(config, 16, 256, device="cpu")
assert resolve_nproc("auto", "cpu") == 1 and cpu_precision("auto") == "fp32" and resolves_to_cpu("cpu")
print(sorted(m for m in ("torch", "prefect") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_compile_may_run_is_told_without_torch(monkeypatch, tmp_path):
    from mygpt.limits import compile_may_run

    cxx = tmp_path / "c++"
    cxx.write_text("#!/bin/sh\nexit 0\n")
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    assert compile_may_run("cpu")
    monkeypatch.setenv("CXX", str(tmp_path / "none"))
    assert not compile_may_run("cpu"), "the compiler CXX names is not there"
    monkeypatch.delenv("CXX")
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert not compile_may_run("cpu"), "no g++, clang++ or c++ on the PATH"
    assert not compile_may_run("mps")
