"""``GPTConfig``: the model's shape, torch-free (``mygpt.model`` builds the model from it and re-exports it).

It holds the one home of each default (the Part I model) and of the shape rules, so checking a model's settings
(the CLI, ``TrainJob.check``, the pipeline's ``ModelSettings``) never needs torch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from mygpt.errors import UserError, check_int

__all__ = [
    "CHECKPOINT_KEYS",
    "LEGACY_CHECKPOINT_DEFAULTS",
    "NORM_TYPES",
    "POSITION_TYPES",
    "REQUIRED_CHECKPOINT_KEYS",
    "GPTConfig",
]

NORM_TYPES = ("layer", "rms")
POSITION_TYPES = ("learned", "rope")
#: The checkpoint ``config`` keys the chapter writes, in its order (the model's part; ``dropout`` is not kept).
CHECKPOINT_KEYS = (
    "vocab_size",
    "embed_dim",
    "num_heads",
    "num_kv_heads",
    "num_layers",
    "max_seq_len",
    "norm_type",
    "position_type",
)
#: What a checkpoint written before chapter 24/28 lacks, and what it meant (``num_kv_heads``: ``num_heads``).
LEGACY_CHECKPOINT_DEFAULTS = {"norm_type": "layer", "position_type": "learned"}
#: What every checkpoint's ``config`` holds, old ones included.
REQUIRED_CHECKPOINT_KEYS = tuple(k for k in CHECKPOINT_KEYS if k not in ("num_kv_heads", *LEGACY_CHECKPOINT_DEFAULTS))


@dataclass(frozen=True)
class GPTConfig:
    """The model's shape: the one home of each default (the Part I model) and of the shape rules.

    Field names are the chapter's checkpoint ``config`` keys (plus ``dropout``, which a checkpoint does not
    keep). ``num_kv_heads=None`` means ``num_heads`` (plain multi-head attention); the built config holds the
    number. Building one checks it: ``UserError`` naming the bad field.
    """

    vocab_size: int
    embed_dim: int = 64
    num_heads: int = 4
    num_kv_heads: int | None = None
    num_layers: int = 4
    max_seq_len: int = 64
    dropout: float = 0.0
    norm_type: str = "layer"
    position_type: str = "learned"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "embed_dim", "num_heads", "num_layers", "max_seq_len"):
            check_int(name, getattr(self, name), 1)
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        check_int("num_kv_heads", self.num_kv_heads, 1)
        self._check_heads()
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise UserError(f"dropout must be in [0, 1), got {self.dropout!r}")
        object.__setattr__(self, "dropout", float(self.dropout))
        if self.norm_type not in NORM_TYPES:
            raise UserError(f"norm_type must be one of {', '.join(NORM_TYPES)}; got {self.norm_type!r}")
        if self.position_type not in POSITION_TYPES:
            raise UserError(f"position_type must be one of {', '.join(POSITION_TYPES)}; got {self.position_type!r}")
        if self.position_type == "rope" and self.head_dim % 2 != 0:
            raise UserError(
                f"position 'rope' needs an even head size, but embed_dim/num_heads = "
                f"{self.embed_dim}/{self.num_heads} = {self.head_dim}; change num_heads or use learned positions"
            )

    def _check_heads(self) -> None:
        num_kv_heads = self.num_kv_heads
        assert num_kv_heads is not None  # __post_init__ has resolved None to num_heads
        if self.embed_dim % self.num_heads != 0:
            raise UserError(
                f"num_heads ({self.num_heads}) must divide embed_dim ({self.embed_dim}); pick an embed_dim that is "
                f"a multiple of num_heads (the chapter uses embed_dim 192, num_heads 6: head size 32)"
            )
        if self.num_heads % num_kv_heads != 0:
            raise UserError(
                f"num_kv_heads ({num_kv_heads}) must divide num_heads ({self.num_heads}); pick a divisor of "
                f"num_heads (the chapter uses num_heads 6, num_kv_heads 2)"
            )

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    def num_params(self) -> int:
        """The parameters ``GPT(self)`` has (``GPT.num_params``), computed without building it: the token
        embedding (also the tied head), a learned position table, and per block two norms, the q/k/v/o
        projections and the MLP; then the final norm."""
        e, kv = self.embed_dim, (self.num_kv_heads or self.num_heads) * self.head_dim
        norm = 2 * e if self.norm_type == "layer" else e
        attention = 2 * e * e + 2 * e * kv
        mlp = 2 * 4 * e * e + 4 * e + e
        positions = self.max_seq_len * e if self.position_type == "learned" else 0
        return self.vocab_size * e + positions + self.num_layers * (2 * norm + attention + mlp) + norm

    @classmethod
    def from_dict(cls, values: dict, what: str = "model config") -> GPTConfig:
        """A config from a dict of its fields; ``UserError`` naming unknown or missing keys."""
        if not isinstance(values, dict):
            raise UserError(f"{what} must be an object of GPTConfig fields, got {type(values).__name__}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise UserError(f"{what} has unknown key(s) {unknown}; known: {names}")
        if "vocab_size" not in values:
            raise UserError(f"{what} lacks vocab_size")
        return cls(**values)

    @classmethod
    def from_checkpoint(cls, config: dict) -> GPTConfig:
        """The config a checkpoint's ``config`` dict describes, old checkpoints included: one written before
        chapter 24/28 has no ``norm_type``/``position_type``/``num_kv_heads`` and means LayerNorm, learned
        positions and plain multi-head attention. Other keys (``tokenizer_kind``) are not the model's."""
        missing = [k for k in REQUIRED_CHECKPOINT_KEYS if k not in config]
        if missing:
            raise UserError(f"the checkpoint's config lacks {', '.join(missing)}")
        values = {**LEGACY_CHECKPOINT_DEFAULTS, **{k: config[k] for k in CHECKPOINT_KEYS if k in config}}
        return cls(**values)

    def to_checkpoint(self) -> dict:
        """The checkpoint's ``config`` fields, in the chapter's order (without ``tokenizer_kind``)."""
        return {name: getattr(self, name) for name in CHECKPOINT_KEYS}
