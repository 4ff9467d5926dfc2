"""The model and training configs the library's tests share."""

from __future__ import annotations

#: A tiny modern model (GQA, RMSNorm, RoPE) a CPU trains quickly; add ``vocab_size``.
TINY_MODEL = dict(
    embed_dim=32, num_heads=4, num_kv_heads=2, num_layers=1, max_seq_len=32, norm_type="rms", position_type="rope"
)
#: A few steps of training the tiny model (``TrainConfig`` fields).
TINY_TRAIN = dict(steps=20, batch_size=4, seq_len=32, lr=3e-3, print_every=5, eval_batches=2)
#: The chapters' models: Part I (207,296 parameters) and chapter 28's (2,163,264).
PART1_MODEL = dict(vocab_size=65, embed_dim=64, num_layers=4, num_heads=4, max_seq_len=64)
CH28_MODEL = dict(
    vocab_size=3046,
    embed_dim=192,
    num_layers=4,
    num_heads=6,
    num_kv_heads=2,
    max_seq_len=256,
    norm_type="rms",
    position_type="rope",
)


def flags(**values) -> list[str]:
    """``mygpt train`` arguments for ``values``: ``flags(embed_dim=32)`` -> ``["--embed-dim", "32"]``."""
    return [part for name, value in values.items() for part in ("--" + name.replace("_", "-"), str(value))]
