"""``GPTConfig``: the model's shape, torch-free, so checking a model's settings never loads torch."""

from __future__ import annotations

from dataclasses import dataclass, fields

from mygpt.errors import UserError, check_int
from mygpt.options import check_options, option

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
#: The checkpoint ``config`` keys the chapter writes, in its order (``dropout`` is not kept).
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
#: The pipeline's upper bounds of the shape (Option.le): far past the largest published models (GPT-3: width
#: 12,288, 96 layers, 96 heads) and any context a run here means, yet finite, so a typo like ``10**30`` is refused
#: by name before a run rather than met by check_memory's arithmetic or an allocation.
MAX_WIDTH = 1 << 16  # embed_dim, and so num_heads and num_kv_heads (each divides it)
MAX_LAYERS = 1 << 10
MAX_SEQ_LEN = 1 << 20  # tokens in one context; the training recipe's seq_len too


@dataclass(frozen=True)
class GPTConfig:
    """The model's shape; defaults are the Part I model. Building one checks it (``UserError`` naming the field).

    ``num_kv_heads=None`` means ``num_heads`` (plain multi-head attention); the built config holds the number.
    """

    vocab_size: int
    embed_dim: int = option(64, "width of the residual stream; the chapter uses 192", ge=1, le=MAX_WIDTH)
    num_heads: int = option(4, "query heads; must divide embed_dim; the chapter uses 6", ge=1, le=MAX_WIDTH)
    num_kv_heads: int | None = option(
        None, "key/value heads (GQA); must divide num_heads; the chapter uses 2", ge=1, le=MAX_WIDTH
    )
    num_layers: int = option(4, "transformer blocks; the chapter uses 4", ge=1, le=MAX_LAYERS)
    max_seq_len: int = option(64, "longest context the model sees; the chapter uses 256", ge=1, le=MAX_SEQ_LEN)
    dropout: float = option(0.0, "dropout probability, in [0, 1)", ge=0)
    norm_type: str = option("layer", "RMSNorm (the chapter) or LayerNorm", name="norm", choices=NORM_TYPES)
    position_type: str = option(
        "learned", "RoPE (the chapter) or learned positions", name="position", choices=POSITION_TYPES
    )

    def __post_init__(self) -> None:
        check_int("vocab_size", self.vocab_size, 1)
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        check_options(self)
        self._check_heads()
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise UserError(f"dropout must be in [0, 1), got {self.dropout!r}")
        object.__setattr__(self, "dropout", float(self.dropout))
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
        """The parameters ``GPT(self)`` has, computed without building it."""
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
        """The config a checkpoint's ``config`` dict describes, old checkpoints (LayerNorm, learned positions,
        plain attention) included; other keys (``tokenizer_kind``) are not the model's."""
        missing = [k for k in REQUIRED_CHECKPOINT_KEYS if k not in config]
        if missing:
            raise UserError(f"the checkpoint's config lacks {', '.join(missing)}")
        values = {**LEGACY_CHECKPOINT_DEFAULTS, **{k: config[k] for k in CHECKPOINT_KEYS if k in config}}
        return cls(**values)

    def to_checkpoint(self) -> dict:
        """The checkpoint's ``config`` fields, in the chapter's order (without ``tokenizer_kind``)."""
        return {name: getattr(self, name) for name in CHECKPOINT_KEYS}
