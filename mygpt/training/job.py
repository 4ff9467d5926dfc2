"""``TrainJob``: everything a training run needs, its data named by file, its configs typed.

It crosses to a training process as JSON (``save``/``load``); in this process it is used as it is.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields

from mygpt.atomic import atomic_write_text
from mygpt.errors import UserError, check_int
from mygpt.gpt_config import GPTConfig
from mygpt.training.config import TrainConfig

__all__ = ["TrainJob", "train_job"]


@dataclass
class TrainJob:
    """A training run: ``tokenizer`` is a tokenizer file (:mod:`mygpt.tokenizers.files`); ``train_tokens`` flat
    token files (``token_dtype``, read as one sequence: each step's windows are drawn uniformly from all of it),
    ``val_tokens`` one such file or several; ``checkpoint`` the resume checkpoint (resumed from when
    ``resume``); ``output`` the final model without optimizer state; ``meta`` goes into both; ``threads``: torch
    threads per process (0 = torch's default). ``model.vocab_size`` must be the tokenizer's."""

    tokenizer: str
    train_tokens: list
    model: GPTConfig
    train: TrainConfig
    checkpoint: str | None = None
    val_tokens: str | list | None = None
    token_dtype: str = "uint16"
    device: str = "auto"
    resume: bool = True
    output: str | None = None
    meta: dict | None = None
    threads: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.train_tokens, (str, os.PathLike)):
            self.train_tokens = [self.train_tokens]
        self.train_tokens = [os.fspath(p) for p in self.train_tokens]
        if isinstance(self.val_tokens, list):
            self.val_tokens = [os.fspath(p) for p in self.val_tokens]
        for name in ("tokenizer", "checkpoint", "val_tokens", "output"):
            value = getattr(self, name)
            if isinstance(value, os.PathLike):
                setattr(self, name, os.fspath(value))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainJob:
        """The job a JSON object describes; ``UserError`` naming what is wrong."""
        if not isinstance(d, dict):
            raise UserError(f"a training job must be a JSON object, got {type(d).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise UserError(f"training job has unknown field(s) {unknown}; known: {sorted(names)}")
        missing = sorted(n for n in ("tokenizer", "train_tokens", "model", "train") if n not in d)
        if missing:
            raise UserError(f"training job lacks field(s) {missing}")
        model = GPTConfig.from_dict(d["model"], "job 'model'")
        train = TrainConfig.from_dict(d["train"], "job 'train'")
        return cls(**{**d, "model": model, "train": train})

    def save(self, path) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path) -> TrainJob:
        try:
            with open(path, encoding="utf-8") as f:
                return cls.from_dict(json.load(f))
        except (OSError, json.JSONDecodeError) as e:
            raise UserError(f"cannot read training job {os.fspath(path)}: {e}") from None

    def open_data(self):
        """``(tokenizer, train tokens, validation tokens or None)``, the token files memory-mapped; ``UserError``
        when the tokenizer's vocabulary is not the model's."""
        from mygpt.tokenizers.files import load_tokenizer_file
        from mygpt.training.data import open_token_files

        tokenizer = load_tokenizer_file(self.tokenizer)
        if self.model.vocab_size != tokenizer.vocab_size:
            raise UserError(
                f"job 'model' has vocab_size {self.model.vocab_size}, but the tokenizer {self.tokenizer} has "
                f"{tokenizer.vocab_size}; build the model's config with the tokenizer's vocab_size"
            )
        train_tokens = open_token_files(self.train_tokens, self.token_dtype)
        val_tokens = open_token_files(self.val_tokens, self.token_dtype) if self.val_tokens else None
        return tokenizer, train_tokens, val_tokens

    def check(self, nproc: int = 1) -> None:
        """Cheap checks before any process starts; ``UserError`` naming the field."""
        from mygpt.device import resolve_device, resolve_precision
        from mygpt.limits import check_memory, check_nproc, check_seq_len

        if not self.checkpoint and not self.output:
            raise UserError("training job needs 'checkpoint' or 'output' (or both): where the trained weights go")
        if not isinstance(self.resume, bool):
            raise UserError(f"job 'resume' must be true or false, got {self.resume!r}")
        check_int("threads", self.threads, 0)
        config, model = self.train, self.model
        _tokenizer, train_tokens, _val_tokens = self.open_data()
        check_seq_len(
            config.seq_len,
            model.max_seq_len,
            names=("job 'train' seq_len", "the model's max_seq_len"),
            hint="lower seq_len or raise max_seq_len",
        )
        if len(train_tokens) < config.seq_len + 1:
            raise UserError(
                f"the training token files hold {len(train_tokens):,} tokens, fewer than one window "
                f"of seq_len + 1 = {config.seq_len + 1:,}"
            )
        check_nproc(config.batch_size, nproc)
        device = resolve_device(self.device)
        check_memory(
            model,
            config.batch_size,
            config.seq_len,
            device=device,
            precision=resolve_precision(device, config.precision),
            nproc=nproc,
            micro_batch_size=config.micro_batch_size,
        )


def train_job(job: TrainJob, device, world, log, on_progress, on_checkpoint):
    """This process's part of ``job``: open the data, build the model after ``torch.manual_seed(seed)`` (as
    ``mygpt train`` does), train; rank 0 writes ``output``. Returns the ``TrainResult``."""
    import torch

    from mygpt.checkpoint import save_checkpoint
    from mygpt.model import GPT
    from mygpt.training.train import train

    tokenizer, train_tokens, val_tokens = job.open_data()
    torch.manual_seed(job.train.seed)
    model = GPT(job.model)
    result = train(
        model,
        tokenizer,
        train_tokens,
        config=job.train,
        val_tokens=val_tokens,
        device=device,
        checkpoint_path=job.checkpoint,
        resume=job.resume,
        log=log,
        on_progress=on_progress,
        on_checkpoint=on_checkpoint,
        meta=job.meta,
        world=world,
    )
    if world.is_main and job.output:
        save_checkpoint(model, tokenizer, job.output, meta=job.meta)
    return result
