"""What a GPU would trip on, checked on the CPU: the product's sources read for device mistakes, the chapter's and a
124M-parameter model built on the ``meta`` device for shapes and memory."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from mygpt import GPT, limits
from mygpt.errors import UserError
from mygpt.gpt_config import GPTConfig
from mygpt.metrics import flops_per_token, training_memory
from tests.mygpt.test_accelerator import GIB, FakeCuda
from tests.support import REPO
from tests.support.tiny_model import CH28_MODEL

#: GPT-2 small's shape (bias-free here): 124,402,944 parameters.
GPT2_124M = dict(
    vocab_size=50257, embed_dim=768, num_layers=12, num_heads=12, max_seq_len=1024, norm_type="layer",
    position_type="learned",
)  # fmt: skip
#: ``torch.cuda`` functions that answer on any machine, CUDA or not.
SAFE_CUDA = {"is_available", "device_count"}


def product_sources() -> list[Path]:
    return sorted(p for top in ("mygpt", "tasks", "flows", "bench") for p in (REPO / top).rglob("*.py"))


def _mentions_cuda(node: ast.AST) -> bool:
    return "cuda" in ast.unparse(node)


def _guarded(call: ast.Call, parents: dict[ast.AST, ast.AST]) -> bool:
    """Inside an ``if``/conditional whose test names cuda, or after an ``if <names cuda>: return/raise`` in the
    same function."""
    node: ast.AST = call
    while node in parents:
        parent = parents[node]
        if isinstance(parent, (ast.If, ast.IfExp)) and node is not parent.test and _mentions_cuda(parent.test):
            return True
        if isinstance(parent, ast.BoolOp) and any(_mentions_cuda(v) for v in parent.values[:1]):
            return True
        body = getattr(parent, "body", None)
        if isinstance(body, list) and node in body:
            for earlier in body[: body.index(node)]:
                if (
                    isinstance(earlier, ast.If)
                    and _mentions_cuda(earlier.test)
                    and isinstance(earlier.body[-1], (ast.Return, ast.Raise))
                ):
                    return True
        node = parent
    return False


def device_mistakes(source: str, name: str) -> list[str]:
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        where = f"{name}:{node.lineno}: {ast.unparse(node)[:80]}"
        attr, receiver = node.func.attr, node.func.value
        if attr == "numpy" and not any(s in ast.unparse(receiver) for s in (".cpu()", ".to('cpu')")):
            found.append(f"{where} (.numpy() of a tensor not moved to the CPU)")
        map_location = any(k.arg == "map_location" for k in node.keywords)
        if attr == "load" and ast.unparse(receiver) == "torch" and not map_location:
            found.append(f"{where} (torch.load without map_location)")
        cuda = isinstance(receiver, ast.Attribute) and receiver.attr == "cuda" and attr not in SAFE_CUDA
        if cuda and not _guarded(node, parents):
            found.append(f"{where} (torch.cuda call not guarded by a cuda check)")
    return found


def test_the_rules_catch_what_they_name():
    bad = """
def f(t, path, device):
    a = t.detach().numpy()
    b = torch.load(path)
    torch.cuda.synchronize()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    c = t.cpu().numpy()
    d = torch.load(path, map_location="cpu")
    n = torch.cuda.device_count()
    if device.type != "cuda":
        return
    torch.cuda.empty_cache()
"""
    found = device_mistakes(bad, "x.py")
    assert [f.split(": ", 1)[0] for f in found] == ["x.py:3", "x.py:4", "x.py:5"]


def test_the_product_moves_to_the_cpu_before_numpy_loads_onto_the_cpu_and_guards_cuda_calls():
    found = [m for path in product_sources() for m in device_mistakes(path.read_text(), str(path.relative_to(REPO)))]
    assert found == []


@pytest.mark.parametrize("shape, params", [(CH28_MODEL, 2_163_264), (GPT2_124M, 124_402_944)])
def test_the_chapters_and_a_124m_model_build_on_meta_with_their_shapes(shape, params):
    config = GPTConfig(**shape)
    with torch.device("meta"):
        model = GPT(config)
        idx = torch.zeros(2, config.max_seq_len, dtype=torch.long)
        logits, loss = model(idx, idx)
    assert model.num_params() == config.num_params() == params
    assert logits.shape == (2, config.max_seq_len, config.vocab_size) and loss.shape == ()
    assert all(p.is_meta for p in model.parameters())
    assert flops_per_token(model, config.max_seq_len) > 6 * params


def test_a_124m_model_fits_a_free_h100_and_not_a_busy_one(monkeypatch):
    config = GPTConfig(**GPT2_124M)
    need = training_memory(config, 16, 1024, "bf16")
    learned = 1024 * 768  # the position table is counted apart
    assert need.state == 16 * (124_402_944 - learned), "16 bytes per parameter: weights, gradients, AdamW's moments"
    gpu = torch.device("cuda", 0)
    FakeCuda(monkeypatch, [("NVIDIA H100 80GB HBM3", (9, 0))], free=79 * GIB)
    limits.check_memory(config, 16, 1024, device=gpu, precision="bf16")
    FakeCuda(monkeypatch, [("NVIDIA H100 80GB HBM3", (9, 0))], free=4 * GIB)
    with pytest.raises(UserError, match=r"^seq_len \(1,024\) makes training need at least .* set micro_batch_size"):
        limits.check_memory(config, 16, 1024, device=gpu, precision="bf16")
    limits.check_memory(config, 16, 1024, device=gpu, precision="bf16", micro_batch_size=2)


def test_the_gpu_check_plans_its_rows_on_the_cpu(shakespeare_path):
    """``bench/gpu_check.py --dry-run`` tokenises the text and plans every row here; without --dry-run and without a
    GPU it is one ``error:`` line, exit 2."""
    import subprocess
    import sys

    run = [sys.executable, "-m", "bench.gpu_check", "--text", str(shakespeare_path), "--steps", "200"]
    dry = subprocess.run([*run, "--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr
    rows = [line.strip().split("  ")[0] for line in dry.stdout.splitlines() if line.startswith("  ")]
    assert rows == [
        f"{n} {p} {c}" for n in ("1 GPU", "2 GPUs") for c in ("eager", "compiled") for p in ("fp32", "bf16")
    ]
    assert "steps 200 (warmup 20), batch 16 x 256" in dry.stdout
    if not torch.cuda.is_available():
        real = subprocess.run(run, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert (real.returncode, real.stdout) == (2, "")
        assert real.stderr.startswith("error: no CUDA GPU here") and real.stderr.count("\n") == 1
