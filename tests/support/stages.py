"""Plain (no Prefect) calls of the stage tasks with keyword settings, for the stage tests."""

from __future__ import annotations

from tasks.corpus import CorpusSettings, download_corpus
from tasks.model import ModelSettings, train_model
from tasks.samples import SamplesSettings, sample_model
from tasks.core.settings import RunOptions
from tasks.shards import ShardsSettings, encode_shards
from tasks.core.stage import StageRef
from tasks.tokenizer import TokenizerSettings, train_tokenizer


def corpus(root, *, run: dict | None = None, **settings) -> StageRef:
    return download_corpus.fn(CorpusSettings(**settings), RunOptions(artifacts_dir=str(root), **(run or {})))


def tokenizer(root, corpus: StageRef, *, run: dict | None = None, **settings) -> StageRef:
    return train_tokenizer.fn(corpus, TokenizerSettings(**settings), RunOptions(artifacts_dir=str(root), **(run or {})))


def shards(root, corpus: StageRef, tokenizer: StageRef, *, run: dict | None = None, **settings) -> StageRef:
    return encode_shards.fn(corpus, tokenizer, ShardsSettings(**settings),
                            RunOptions(artifacts_dir=str(root), **(run or {})))


def model(root, shards: StageRef, tokenizer: StageRef, *, run: dict | None = None, **settings) -> StageRef:
    return train_model.fn(shards, tokenizer, ModelSettings(**settings), RunOptions(artifacts_dir=str(root), **(run or {})))


def samples(root, model: StageRef, *, run: dict | None = None, **settings) -> StageRef:
    return sample_model.fn(model, SamplesSettings(**settings), RunOptions(artifacts_dir=str(root), **(run or {})))
