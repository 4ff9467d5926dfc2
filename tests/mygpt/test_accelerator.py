"""The accelerator paths, proven without one: the torch-free device answer against fake /dev, /proc and /sys trees,
and torch.cuda (or macOS) faked for the precision, the NCCL branch, the peak FLOPs and the memory check."""

from __future__ import annotations

import sys

import pytest
import torch

from mygpt import device as device_mod
from mygpt import limits, metrics
from mygpt.errors import UserError
from mygpt.gpt_config import GPTConfig
from tests.support.tiny_model import CH28_MODEL

GIB = 2**30


def fake_tree(root, paths):
    """``dev``, ``proc`` and ``sys`` folders under ``root`` holding ``paths`` (``"dev/nvmap"``, ...)."""
    for name in ("dev", "proc", "sys"):
        (root / name).mkdir(parents=True)
    for harmless in ("dev/null", "dev/tty", "dev/dri", "proc/cpuinfo", "sys/module/snd"):
        (root / harmless).parent.mkdir(parents=True, exist_ok=True)
        (root / harmless).touch()
    for path in paths:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).mkdir()
    return str(root / "dev"), str(root / "proc"), str(root / "sys")


@pytest.mark.parametrize(
    "machine, paths",
    [
        ("NVIDIA driver loaded, no node yet (headless, no persistence daemon)", ["proc/driver/nvidia"]),
        ("NVIDIA kernel module only", ["sys/module/nvidia"]),
        ("Jetson board", ["dev/nvhost-ctrl-gpu", "dev/nvmap", "sys/module/nvgpu"]),
        ("Jetson node alone", ["dev/nvmap"]),
        ("ROCm", ["dev/kfd", "sys/module/amdgpu"]),
        ("AMD driver, no node", ["sys/module/amdgpu"]),
        ("WSL 2", ["dev/dxg"]),
    ],
)
def test_auto_is_left_to_torch_wherever_a_gpu_may_be(tmp_path, monkeypatch, machine, paths):
    monkeypatch.setattr(sys, "platform", "linux")
    plain = fake_tree(tmp_path / "plain", [])
    assert limits.resolves_to_cpu("auto", *plain), "nothing but harmless nodes: the CPU"
    assert limits.accelerator_evidence(*plain) is None
    gpu = fake_tree(tmp_path / "gpu", paths)
    assert not limits.resolves_to_cpu("auto", *gpu), machine
    assert limits.accelerator_evidence(*gpu) is not None
    assert limits.resolves_to_cpu("cpu", *gpu)


def test_auto_falling_back_to_the_cpu_beside_a_gpu_driver_says_so_in_one_line(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(device_mod, "accelerator_evidence", lambda: "/proc/driver/nvidia")
    (line,) = device_mod.device_warnings("auto", cpu, "auto", "fp32")
    assert line.startswith("device auto settled on the CPU, but /proc/driver/nvidia says a GPU driver is here")
    assert "torch.cuda.is_available() is False" in line and "\n" not in line
    assert device_mod.device_warnings("cpu", cpu, "auto", "fp32") == [], "the CPU asked for: nothing to say"
    monkeypatch.setattr(device_mod, "accelerator_evidence", lambda: None)
    assert device_mod.device_warnings("auto", cpu, "auto", "fp32") == []


@pytest.mark.skipif(torch.version.cuda is not None, reason="this torch is a CUDA build")
def test_a_cpu_build_of_torch_beside_a_gpu_driver_is_not_called_no_gpu(tmp_path):
    """The venv's torch is the CPU wheel: beside a loaded NVIDIA driver (a fake ``/proc``) the reason names the
    build and how to install a CUDA one (what ``bench/gpu_check.py`` prints), not "no CUDA GPU here"."""
    evidence = limits.accelerator_evidence(*fake_tree(tmp_path, ["proc/driver/nvidia"]))
    reason = device_mod.no_cuda_reason(evidence)
    assert reason.startswith(f"torch {torch.__version__} here is a CPU build (torch.version.cuda is None), but ")
    assert f"{evidence} says a GPU driver is here" in reason and "\n" not in reason
    assert f"--index-url https://download.pytorch.org/whl/cu128 torch=={torch.__version__.split('+')[0]}" in reason
    assert device_mod.no_cuda_reason(None) == "no CUDA GPU here (torch.cuda.is_available() is False)"


class FakeCuda:
    """``torch.cuda`` as a machine with GPUs would answer: ``gpus`` is ``[(name, capability), ...]``."""

    def __init__(self, monkeypatch, gpus, free=80 * GIB, total=80 * GIB, current=0):
        self.calls: list = []
        c = torch.cuda
        monkeypatch.setattr(c, "is_available", lambda: True)
        monkeypatch.setattr(c, "device_count", lambda: len(gpus))
        monkeypatch.setattr(c, "current_device", lambda: current)
        monkeypatch.setattr(c, "get_device_name", lambda i=None: gpus[self._index(i, current)][0])
        monkeypatch.setattr(c, "get_device_capability", lambda i=None: gpus[self._index(i, current)][1])
        monkeypatch.setattr(c, "is_bf16_supported", lambda including_emulation=True: True)
        monkeypatch.setattr(c, "mem_get_info", lambda i=None: (free, total))
        monkeypatch.setattr(c, "set_device", lambda d: self.calls.append(("set_device", d)))

        class Props:
            total_memory = total
            name = gpus[current][0]

        monkeypatch.setattr(c, "get_device_properties", lambda i=None: Props())

    @staticmethod
    def _index(i, current):
        if isinstance(i, torch.device):
            return i.index if i.index is not None else current
        return current if i is None else i


@pytest.mark.parametrize(
    "name, capability, auto",
    [
        ("Tesla V100-SXM2-16GB", (7, 0), "fp32"),
        ("Tesla T4", (7, 5), "fp32"),
        ("NVIDIA A100-SXM4-40GB", (8, 0), "bf16"),
        ("NVIDIA H100 80GB HBM3", (9, 0), "bf16"),
    ],
)
def test_precision_auto_is_bf16_only_where_the_gpu_has_it_natively(monkeypatch, name, capability, auto):
    FakeCuda(monkeypatch, [(name, capability)])
    dev = device_mod.resolve_device("auto")
    assert dev == torch.device("cuda")
    assert device_mod.resolve_precision(dev, "auto") == auto
    assert device_mod.resolve_precision(dev, "bf16") == "bf16", "asked for: allowed (emulated below 8.0)"
    warnings = device_mod.device_warnings("auto", dev, "auto", auto)
    if auto == "fp32":
        assert warnings == [
            f"precision auto is fp32 here: {name} has compute capability {capability[0]}.{capability[1]} "
            f"(below 8.0: no native bf16)"
        ]
        (emulated,) = device_mod.device_warnings("auto", dev, "bf16", "bf16")
        assert emulated.startswith("precision bf16 is emulated here: ")
    else:
        assert warnings == [] and device_mod.device_warnings("auto", dev, "bf16", "bf16") == []


def test_precision_looks_at_the_gpu_given_not_the_current_one(monkeypatch):
    FakeCuda(monkeypatch, [("Tesla V100-SXM2-16GB", (7, 0)), ("NVIDIA H100 80GB HBM3", (9, 0))], current=0)
    assert device_mod.resolve_precision(device_mod.resolve_device("cuda:1"), "auto") == "bf16"
    assert device_mod.resolve_precision(device_mod.resolve_device("cuda:0"), "auto") == "fp32"
    assert device_mod.resolve_precision(torch.device("cuda"), "auto") == "fp32", "no index: the current GPU"


@pytest.mark.parametrize("release, auto", [("13.6.1", "fp32"), ("14.2", "bf16"), ("15.0", "bf16")])
def test_mps_offers_bf16_from_macos_14_only(monkeypatch, release, auto):
    monkeypatch.setattr(device_mod, "mps_available", lambda: True)
    monkeypatch.setattr(device_mod.platform, "mac_ver", lambda: (release, ("", "", ""), "arm64"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    dev = device_mod.resolve_device("auto")
    assert dev == torch.device("mps") and device_mod.resolve_precision(dev, "auto") == auto
    if auto == "fp32":
        with pytest.raises(UserError, match=r"^precision 'bf16' is not supported on device mps \(MPS on macOS 13"):
            device_mod.resolve_precision(dev, "bf16")
        assert device_mod.device_warnings("mps", dev, "auto", "fp32") == [
            "precision auto is fp32 here: MPS on macOS 13.6.1 (PyTorch offers bf16 on MPS from macOS 14)"
        ]
    else:
        assert device_mod.resolve_precision(dev, "bf16") == "bf16"


def test_compile_on_mps_falls_back_to_eager():
    assert device_mod.compile_unavailable(torch.device("mps")) == "TorchInductor's MPS backend is experimental"


def test_the_nccl_branch_pins_each_rank_to_its_gpu(monkeypatch):
    import torch.distributed as dist
    import torch.nn.parallel

    from mygpt.training.parallel import wrap_ddp
    from mygpt.training.worker import join_process_group

    cuda = FakeCuda(monkeypatch, [("NVIDIA H100 80GB HBM3", (9, 0))] * 2, current=1)
    joined = []
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: joined.append((backend, kw)))
    dev = join_process_group(torch.device("cuda"), local_rank=1)
    assert dev == torch.device("cuda", 1)
    assert cuda.calls == [("set_device", torch.device("cuda", 1))]
    assert joined == [("nccl", {"device_id": torch.device("cuda", 1)})]
    assert join_process_group(torch.device("cpu"), local_rank=1) == torch.device("cpu")
    assert joined[-1] == ("gloo", {})

    wrapped = []
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", lambda m, **kw: wrapped.append(kw) or m)
    model = torch.nn.Linear(2, 2)
    assert wrap_ddp(model, torch.device("cuda", 1)) is model
    wrap_ddp(model, torch.device("cuda"))
    wrap_ddp(model, torch.device("cpu"))
    assert [w["device_ids"] for w in wrapped] == [[1], [1], None]
    assert all(w["forward_sync_buffers"] is False for w in wrapped)


@pytest.mark.parametrize(
    "name, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA H200 NVL", 835.0),
        ("NVIDIA GH200 480GB", 989.0),
        ("NVIDIA H800", 989.0),
        ("NVIDIA H800 PCIe", 756.0),
        ("NVIDIA B200", 2250.0),
        ("NVIDIA GB200", 2500.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA L40S", 362.0),
        ("NVIDIA L4", 121.0),
        ("Tesla V100-SXM2-16GB", None),
        ("NVIDIA GeForce RTX 4090", 165.2),
        ("NVIDIA GeForce RTX 4090 D", 147.1),
        ("NVIDIA GeForce RTX 3090", 71.0),
        ("NVIDIA GeForce RTX 3090 Ti", 80.0),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", None),  # a slice: no table figure is its peak
        ("NVIDIA A100-SXM4-80GB MIG 7g.80gb", None),
    ],
)
def test_the_peak_of_a_specific_part_is_its_own_not_its_familys(monkeypatch, name, peak):
    monkeypatch.delenv(metrics.PEAK_ENV, raising=False)
    FakeCuda(monkeypatch, [(name, (9, 0))])
    assert metrics.peak_tflops(torch.device("cuda", 0))[0] == peak


def test_a_mig_slice_has_no_mfu_unless_its_peak_is_given(monkeypatch):
    monkeypatch.delenv(metrics.PEAK_ENV, raising=False)
    FakeCuda(monkeypatch, [("NVIDIA H100 80GB HBM3 MIG 1g.10gb", (9, 0))])
    peak, note = metrics.peak_tflops(torch.device("cuda", 0))
    assert peak is None and note == (
        f"NVIDIA H100 80GB HBM3 MIG 1g.10gb is a MIG slice, whose peak is not its GPU's (set {metrics.PEAK_ENV})"
    )
    monkeypatch.setenv(metrics.PEAK_ENV, "120")
    assert metrics.peak_tflops(torch.device("cuda", 0))[0] == 120.0


def test_no_peak_table_entry_is_hidden_behind_an_earlier_one():
    keys = [key for key, _ in metrics.GPU_BF16_PEAK_TFLOPS]
    for i, earlier in enumerate(keys):
        for later in keys[i + 1 :]:
            assert earlier not in later, f"{later!r} can never match: {earlier!r} comes first"


def test_the_memory_check_on_cuda_counts_the_free_memory_not_the_total(monkeypatch):
    config = GPTConfig(**CH28_MODEL)
    FakeCuda(monkeypatch, [("NVIDIA H100 80GB HBM3", (9, 0))], free=80 * GIB)
    limits.check_memory(config, 4096, 256, device=torch.device("cuda", 0), precision="bf16")
    FakeCuda(monkeypatch, [("NVIDIA H100 80GB HBM3", (9, 0))], free=1 * GIB)  # another process holds the rest
    with pytest.raises(UserError) as e:
        limits.check_memory(config, 4096, 256, device=torch.device("cuda", 0), precision="bf16")
    message = str(e.value)
    assert message.startswith("batch_size (4,096) makes training need at least ")
    assert "more than the 1.0 GiB free on the GPU (NVIDIA H100 80GB HBM3, 80.0 GiB in all)" in message
    assert "or set micro_batch_size to fewer than the 4,096 rows each process runs at once (e.g. 2,048;" in message
    limits.check_memory(config, 4096, 256, device=torch.device("cuda", 0), precision="bf16", micro_batch_size=64)


def test_tf32_is_set_through_the_legacy_flags_and_readable_inside_and_restored():
    """Inside, every TF32 reader answers (TorchInductor reads ``get_float32_matmul_precision``); a compiled
    matmul in max-autotune-no-cudagraphs mode runs there on the CPU and equals eager."""
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    with device_mod.tf32_matmuls(torch.device("cuda")):  # flags only: no CUDA call is made
        assert torch.get_float32_matmul_precision() == "high"
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        torch.manual_seed(0)
        layer, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
        compiled = torch.compile(layer, mode="max-autotune-no-cudagraphs")
        assert torch.allclose(compiled(x), layer(x), atol=1e-6)
    assert (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32) == before
    with device_mod.tf32_matmuls(torch.device("cpu")):
        assert torch.get_float32_matmul_precision() == before[0], "a no-op off CUDA"


def test_deterministic_mode_is_opt_in_and_restored(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.delenv(device_mod.DETERMINISTIC_ENV, raising=False)
    with device_mod.deterministic_mode():
        assert not torch.are_deterministic_algorithms_enabled()
    monkeypatch.setenv(device_mod.DETERMINISTIC_ENV, "1")
    with device_mod.deterministic_mode():
        assert torch.are_deterministic_algorithms_enabled()
        import os

        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert not torch.are_deterministic_algorithms_enabled()
