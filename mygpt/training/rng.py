"""Every RNG state a training run draws from, captured into a checkpoint and restored from it: this process's
global torch (and CUDA) state, which dropout draws from and which differs between ranks, the batch generator, numpy
and Python. Kept as tensors and plain lists, so checkpoints load with ``weights_only=True``."""

from __future__ import annotations

import random
from typing import cast

import numpy as np
import torch

from mygpt.training.parallel import World

__all__ = ["capture_rng", "rank_rng", "restore_rng"]


def rank_rng(device: torch.device) -> dict:
    """This process's own global RNG states (dropout draws from them; they differ between ranks)."""
    rng = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(device)
    return rng


def capture_rng(gen: torch.Generator, device: torch.device, ranks: list | None = None) -> dict:
    # The legacy tuple (the global RNG is an MT19937); numpy's stubs type the default call as the dict form.
    np_state = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())
    py_state = random.getstate()
    rng = {
        **rank_rng(device),
        "generator": gen.get_state(),
        "numpy": {
            "kind": np_state[0],
            "keys": np_state[1].tolist(),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }
    if ranks is not None:
        rng["ranks"] = ranks
    return rng


def _setrank_rng(rng: dict, device: torch.device) -> None:
    """Restore what :func:`rank_rng` captured."""
    torch.set_rng_state(rng["torch"])
    if device.type == "cuda" and "cuda" in rng:
        torch.cuda.set_rng_state(rng["cuda"], device)


def restore_rng(
    rng: dict, gen: torch.Generator, device: torch.device, world: World | None = None, seed: int = 0
) -> None:
    """Restore what :func:`capture_rng` captured. Each rank gets its own saved global state back where the
    checkpoint was written by as many processes; with another number, rank 0 continues the saved main stream
    and every other rank starts its own from ``seed + rank``, as a fresh run seeds it: handing them rank 0's
    state would make every rank draw the same dropout masks."""
    rank = world.rank if world is not None else 0
    ranks = rng.get("ranks")
    if world is not None and ranks and len(ranks) == world.size:  # same world size: each rank its own stream
        _setrank_rng(ranks[rank], device)
    elif rank == 0:
        _setrank_rng(rng, device)
    else:
        torch.manual_seed(seed + rank)
    gen.set_state(rng["generator"])
    n = rng.get("numpy")
    if n:
        np.random.set_state(
            (n["kind"], np.array(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
        )
    p = rng.get("python")
    if p:
        random.setstate((p[0], tuple(p[1]), p[2]))
