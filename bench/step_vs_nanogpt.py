"""The side-by-side part of ``bench.train_throughput``: one training step of mygpt's chapter-28 model against
nanoGPT's ``model.py`` for the same shapes, interleaved in one process, with where a step's time goes and the
step's share of the CPU's measured matmul peak (its MFU).

nanoGPT is imported from a checkout given by path (never vendored). Its step is its ``train.py``'s: AdamW from
``configure_optimizers`` (weight decay 0.1 on 2-D tensors), clipping at 1.0. Ours is ``mygpt.training.train``'s:
``make_optimizer`` and ``clip_gradients`` from the same ``TrainConfig`` (``fused`` on or off).
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from mygpt import GPT, GPTConfig, TrainConfig, UserError
from mygpt.device import compile_options
from mygpt.training.train import clip_gradients, make_optimizer

#: A step's time by what it computes: profiler ops sorted by name and shape (see ``category``).
CATEGORIES = ("attention", "attn proj", "mlp", "lm head", "loss", "norm", "elementwise", "optimizer", "clip", "python")


@dataclass
class Contender:
    name: str
    step: Callable[[], None]
    flops_per_token: int


def load_nanogpt(path: str):
    """nanoGPT's ``model`` module from a checkout (its folder or its ``model.py``)."""
    file = Path(path)
    file = file / "model.py" if file.is_dir() else file
    if not file.is_file():
        raise UserError(f"--vs-nanogpt {path}: no nanoGPT model.py there; check out karpathy/nanoGPT and pass its path")
    spec = importlib.util.spec_from_file_location("nanogpt_model", file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def flops(params: int, layers: int, width: int, seq_len: int) -> int:
    """``6N + 12*L*E*T`` (mygpt.metrics' formula; ``H * Q = E``)."""
    return 6 * params + 12 * layers * width * seq_len


def contenders(nanogpt_path: str, model: GPTConfig, batch: int, seq_len: int, compile_: bool) -> list[Contender]:
    """nanoGPT, mygpt's plain step (``fused=False``, the logits kept), its default step with the logits kept
    (the LM head and loss of ``forward``), its default step (the training step's: the blockwise head and loss),
    and (``compile_``) that compiled."""
    ng = load_nanogpt(nanogpt_path)
    x = torch.randint(0, model.vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(0))
    y = torch.roll(x, -1, dims=1)
    cpu = torch.device("cpu")

    torch.manual_seed(0)
    shape = dict(block_size=model.max_seq_len, vocab_size=model.vocab_size, n_layer=model.num_layers)
    nano = ng.GPT(ng.GPTConfig(**shape, n_head=model.num_heads, n_embd=model.embed_dim, dropout=0.0, bias=False))
    nano_opt = nano.configure_optimizers(0.1, 3e-4, (0.9, 0.95), "cpu")

    def nano_step() -> None:
        nano_opt.zero_grad(set_to_none=True)
        nano(x, y)[1].backward()
        torch.nn.utils.clip_grad_norm_(nano.parameters(), 1.0)
        nano_opt.step()

    nano_params = sum(p.numel() for p in nano.parameters()) - nano.transformer.wpe.weight.numel()
    out = [Contender("nanoGPT", nano_step, flops(nano_params, model.num_layers, model.embed_dim, seq_len))]

    def ours(name: str, fused: bool, compiled: bool, keep_logits: bool = False) -> Contender:
        torch.manual_seed(0)
        gpt = GPT(model)
        config = TrainConfig(batch_size=batch, seq_len=seq_len, lr=3e-4, max_grad_norm=1.0, fused=fused)
        optimizer = make_optimizer(gpt, config, cpu)
        forward = torch.compile(gpt, options=compile_options(cpu)) if compiled else gpt

        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            forward(x, y, keep_logits=keep_logits)[1].backward()
            clip_gradients(gpt, config)
            optimizer.step()

        return Contender(name, step, flops(gpt.num_params(), model.num_layers, model.embed_dim, seq_len))

    out += [ours("mygpt plain", False, False, True), ours("logits kept", True, False, True)]
    out.append(ours("mygpt", True, False))
    if compile_:
        out.append(ours("mygpt compiled", True, True))
    return out


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def race(players: list[Contender], rounds: int, steps: int, log=print) -> dict[str, dict]:
    """Best-of-``rounds`` seconds per step (wall and process CPU), each round every contender's ``steps`` steps
    in turn, so load on the machine falls on all of them alike. The first step of each (compile) is not timed."""
    first = {}
    for p in players:
        t = time.perf_counter()
        p.step()
        first[p.name] = time.perf_counter() - t
    best = {p.name: {"wall": float("inf"), "cpu": float("inf"), "first": first[p.name]} for p in players}
    for r in range(rounds):
        for p in players:
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(steps):
                p.step()
            b = best[p.name]
            b["wall"] = min(b["wall"], (time.perf_counter() - wall) / steps)
            b["cpu"] = min(b["cpu"], (time.process_time() - cpu) / steps)
        log(
            f"  round {r + 1}/{rounds}: "
            + ", ".join(f"{n} {1000 * b['wall']:.0f} ms" for n, b in best.items())
            + f"   (load {loadavg()})"
        )
    return best


def category(name: str, shapes: list, model: GPTConfig) -> str:
    """What a profiler op computes, by its name and (for matmuls) its operands' shapes."""
    n = name.lower()
    if "scaled_dot_product" in n or "repeat_interleave" in n or "index_add" in n:
        return "attention"
    if "softmax" in n or "nll_loss" in n or "cross_entropy" in n:
        return "loss"
    if "norm" in n and "vector_norm" not in n:
        return "norm"
    if "gelu" in n:
        return "mlp"
    if n in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul"):
        dims = {d for s in shapes for d in (s or [])}
        if model.vocab_size in dims:
            return "lm head"
        return "mlp" if 4 * model.embed_dim in dims else "attn proj"
    return "elementwise"


def profile(player: Contender, model: GPTConfig, steps: int) -> dict[str, float]:
    """Seconds per step by :data:`CATEGORIES`: the optimizer's and the clip's ops by where they ran, the others
    by :func:`category`; ``python`` is the step's wall time the ops' own time does not cover."""
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    clip_fn = torch.nn.utils.clip_grad_norm_
    original = torch.nn.utils.clip_grad_norm_

    def labelled_clip(*args, **kwargs):
        with record_function("## clip"):
            return clip_fn(*args, **kwargs)

    torch.nn.utils.clip_grad_norm_ = labelled_clip  # both steps call it through torch.nn.utils
    try:
        with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            wall = time.perf_counter()
            for _ in range(steps):
                player.step()
            wall = time.perf_counter() - wall
    finally:
        torch.nn.utils.clip_grad_norm_ = original
    events = [e for e in prof.events() if e.device_type.name == "CPU"]
    spans: dict[str, list] = {"optimizer": [], "clip": []}
    for e in events:
        if e.name.startswith("Optimizer.step#"):
            spans["optimizer"].append(e.time_range)
        elif e.name == "## clip":
            spans["clip"].append(e.time_range)
    totals = dict.fromkeys(CATEGORIES, 0.0)
    for e in events:
        if not e.name.startswith("aten::") or e.self_cpu_time_total <= 0:
            continue
        where = next((k for k, ranges in spans.items() for r in ranges if r.start <= e.time_range.start <= r.end), None)
        key = where or category(e.name, e.input_shapes or [], model)
        totals[key] += e.self_cpu_time_total / 1e6
    totals["python"] = max(0.0, wall - sum(totals.values()))
    return {k: v / steps for k, v in totals.items()}


def matmul_peak(threads: int, n: int = 2048, repeats: int = 5) -> float:
    """The CPU's fp32 matmul FLOP/s: the best of ``repeats`` ``torch.mm`` of two n x n matrices, on ``threads``."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.mm(a, b)
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t)
    finally:
        torch.set_num_threads(before)
    return 2 * n**3 / best


def main(
    nanogpt: str,
    model: GPTConfig,
    batch: int,
    seq_len: int,
    *,
    rounds: int,
    steps: int,
    threads: int,
    compile_: bool,
    profile_steps: int,
) -> int:
    torch.set_num_threads(threads)
    print(
        f"torch {torch.__version__}, {threads} thread(s), {os.cpu_count()} cores; B={batch} T={seq_len} "
        f"V={model.vocab_size} L={model.num_layers} H={model.num_heads} E={model.embed_dim}; load {loadavg()}"
    )
    players = contenders(nanogpt, model, batch, seq_len, compile_)
    peak = matmul_peak(threads)
    best = race(players, rounds, steps)
    peak = max(peak, matmul_peak(threads))  # before and after the race: the better of two looks at the CPU
    tokens = batch * seq_len
    base = best["nanoGPT"]["wall"]
    print(
        f"\nbest of {rounds} rounds x {steps} steps; CPU fp32 matmul peak {peak / 1e9:.1f} GFLOP/s "
        f"(torch.mm 2048^2, {threads} threads); load {loadavg()}"
    )
    print(
        f"{'':<15} {'first':>8} {'ms/step':>8} {'cpu ms':>8} {'tokens/s':>9} {'vs nanoGPT':>10} "
        f"{'GFLOP/s':>8} {'CPU MFU':>7}"
    )
    for p in players:
        b = best[p.name]
        achieved = tokens / b["wall"] * p.flops_per_token
        print(
            f"{p.name:<15} {b['first']:>7.2f}s {1000 * b['wall']:>8.1f} {1000 * b['cpu']:>8.1f} "
            f"{tokens / b['wall']:>9,.0f} {base / b['wall']:>9.3f}x {achieved / 1e9:>8.2f} "
            f"{100 * achieved / peak:>6.1f}%"
        )
    if profile_steps:
        print(f"\nwhere a step's time goes (ms per step, torch.profiler over {profile_steps} steps)")
        rows = {p.name: profile(p, model, profile_steps) for p in players if p.name != "mygpt compiled"}
        print(f"{'':<12}" + "".join(f"{n:>14}" for n in rows))
        for c in CATEGORIES:
            print(f"{c:<12}" + "".join(f"{1000 * r[c]:>14.1f}" for r in rows.values()))
        print(f"{'total':<12}" + "".join(f"{1000 * sum(r.values()):>14.1f}" for r in rows.values()))
    return 0
