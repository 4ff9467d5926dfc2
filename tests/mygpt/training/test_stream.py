"""Streamed shards (mygpt.training.stream): the block schedule, batches equal to a fully local source's whatever
the files' arrival, one block = the whole split's batches, and a streamed run resumed to the bit."""

from __future__ import annotations

import os
import random
import threading
import time

import numpy as np
import pytest
import torch

from mygpt import GPT, CharTokenizer, TrainConfig, UserError
from mygpt.training import stream as stream_mod
from mygpt.training.data import ConcatTokens, get_batch
from mygpt.training.stream import (
    BLOCK_SHARDS,
    BlockSchedule,
    ShardStream,
    failed_file,
    heartbeat_file,
    position_file,
)
from mygpt.training.train import train
from tests.support.tiny_model import TINY_MODEL, TINY_TRAIN


def _shards(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 60_000, int(rng.integers(300, 900)), dtype=np.uint16) for _ in range(n)]


def _write(folder, arrays: list[np.ndarray], order=None, delay: float = 0.0) -> list[list]:
    """``[[path, tokens], ...]``; the files written in ``order`` (by a thread with ``delay``: they arrive late)."""
    files = [[str(folder / f"train-{i:05d}.bin"), len(a)] for i, a in enumerate(arrays)]

    def put() -> None:
        for i in order if order is not None else range(len(arrays)):
            time.sleep(delay)
            tmp = folder / f".{i}.tmp"
            arrays[i].tofile(tmp)
            os.replace(tmp, files[i][0])

    if delay:
        threading.Thread(target=put, daemon=True).start()
    else:
        put()
    return files


def test_each_epoch_reads_every_shard_once_in_blocks_known_from_seed_and_step():
    counts = [500] * 10 + [0, 3]  # an empty shard is never read; a tiny one joins its neighbour's block
    s = BlockSchedule(counts, seed=3, tokens_per_step=64, window=33)
    blocks = list(s.blocks(1, 400))
    assert blocks[0].first == 1 and all(b.first == a.last + 1 for a, b in zip(blocks, blocks[1:]))
    assert [b.index for b in blocks] == list(range(len(blocks)))
    epoch, seen = [], 0
    for b in blocks:
        epoch += b.shards
        assert sum(counts[i] for i in b.shards) >= 33 and list(b.shards) == sorted(b.shards)
        if sorted(epoch) == [i for i, c in enumerate(counts) if c]:
            seen, epoch = seen + 1, []
    assert seen >= 2, "every epoch reads each shard exactly once"
    assert all(s.at(st) == b for b in blocks for st in (b.first, b.last))
    again = BlockSchedule(counts, seed=3, tokens_per_step=64, window=33)
    assert [again.at(st) for st in range(400, 0, -37)] == [s.at(st) for st in range(400, 0, -37)], "from (seed, step)"
    other = BlockSchedule(counts, seed=4, tokens_per_step=64, window=33)
    assert [b.shards for b in other.blocks(1, 400)] != [b.shards for b in blocks]
    with pytest.raises(UserError, match="fewer than one window of seq_len"):
        BlockSchedule([10, 10], seed=0, tokens_per_step=64, window=33)


def test_streamed_batches_equal_a_fully_local_source_whatever_order_the_shards_arrive_in(tmp_path):
    arrays = _shards(11)
    order = list(range(11))
    random.Random(1).shuffle(order)
    stream = ShardStream(_write(tmp_path, arrays, order=order, delay=0.01), "uint16", str(tmp_path))
    schedule = stream.schedule_for(seed=5, batch_size=6, seq_len=32)
    got, want = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    for step in range(1, 60):
        block = schedule.at(step)
        local = np.concatenate([arrays[i] for i in block.shards])  # the block, fully local
        x, y = stream.batch(step, 6, 32, got, "cpu", None, rank=0)
        x2, y2 = get_batch(local, 6, 32, want, "cpu")
        assert torch.equal(x, x2) and torch.equal(y, y2), step
        with open(position_file(tmp_path, 0)) as f:
            assert int(f.read()) == block.index, "the reader says which block it reads"
    assert len({schedule.at(s).index for s in range(1, 60)}) > 2, "the run crossed several blocks"
    # rows: a rank reads only its rows of the same draw
    rows_gen, all_gen = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    part, _ = stream.batch(7, 6, 32, rows_gen, "cpu", slice(2, 4), rank=1)
    whole, _ = stream.batch(7, 6, 32, all_gen, "cpu", None, rank=1)
    assert torch.equal(part, whole[2:4])


def test_a_split_of_one_block_gives_the_batches_of_the_whole_split_as_one_sequence(tmp_path):
    arrays = _shards(BLOCK_SHARDS)
    stream = ShardStream(_write(tmp_path, arrays), "uint16", str(tmp_path))
    stream.schedule_for(seed=1, batch_size=5, seq_len=16)
    whole = ConcatTokens(arrays)
    a, b = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    for step in range(1, 200, 7):
        assert torch.equal(stream.batch(step, 5, 16, a, "cpu", None, 0)[0], get_batch(whole, 5, 16, b, "cpu")[0])
    assert np.array_equal(stream[100:200], whole[100:200]), "as validation data: the whole split"


def test_a_reader_waiting_for_a_shard_gets_the_fetcher_s_error(tmp_path):
    stream = ShardStream([[str(tmp_path / "train-00000.bin"), 100]], "uint16", str(tmp_path))
    stream.schedule_for(seed=0, batch_size=2, seq_len=8)
    threading.Timer(0.1, lambda: open(failed_file(tmp_path), "w").write("shard x is damaged\n")).start()
    with pytest.raises(UserError, match="shard x is damaged"):
        stream.batch(1, 2, 8, torch.Generator().manual_seed(0), "cpu", None, 0)


def test_a_reader_waits_while_the_fetcher_beats_and_names_the_file_once_it_falls_silent(tmp_path, monkeypatch):
    monkeypatch.setattr(stream_mod, "FETCHER_SILENT_SECONDS", 0.3)
    arrays = _shards(1)
    path = tmp_path / "train-00000.bin"
    stop = threading.Event()

    def fetcher() -> None:  # beats for longer than the silence allowed, then brings the file
        for beat in range(40):
            with open(heartbeat_file(tmp_path), "w") as f:
                f.write(str(beat))
            time.sleep(0.02)
        arrays[0].tofile(tmp_path / ".tmp")
        os.replace(tmp_path / ".tmp", path)
        stop.set()

    threading.Thread(target=fetcher, daemon=True).start()
    stream = ShardStream([[str(path), len(arrays[0])]], "uint16", str(tmp_path))
    assert np.array_equal(stream[0:10], arrays[0][:10]) and stop.is_set()
    silent = ShardStream([[str(tmp_path / "train-00001.bin"), 100]], "uint16", str(tmp_path))
    with pytest.raises(UserError, match=r"token file .*train-00001\.bin is not there and the shard fetcher .* no sign"):
        silent[0:10]


class Stop(Exception):
    pass


def test_a_streamed_run_resumed_from_its_checkpoint_equals_an_uninterrupted_one(shakespeare_text, tmp_path):
    text = shakespeare_text[:40_000]
    tok = CharTokenizer.from_text(text)
    ids = tok.encode_array(text).astype(np.uint16)
    arrays = np.array_split(ids[:36_000], 24)  # 24 shards: six blocks of some 23 steps
    val = ids[36_000:]
    cfg = TrainConfig(**{**TINY_TRAIN, "steps": 30, "batch_size": 8, "checkpoint_every": 10, "seed": 2})

    def run(folder, ckpt, on_checkpoint=None, init=0):
        folder.mkdir()
        stream = ShardStream(_write(folder, list(arrays)), "uint16", str(folder))
        torch.manual_seed(init)
        model = GPT(vocab_size=tok.vocab_size, **TINY_MODEL)
        result = train(
            model, tok, stream, config=cfg, val_tokens=val, device="cpu", checkpoint_path=ckpt, log=None,
            on_checkpoint=on_checkpoint,
        )  # fmt: skip
        return model, result

    straight, _ = run(tmp_path / "a", tmp_path / "a.ckpt")
    schedule = BlockSchedule([len(a) for a in arrays], 2, 8 * 32, 33)
    assert schedule.at(30).index >= 1, "the run reads more than one block"

    def stop_at_20(step, path):
        if step == 20:
            raise Stop

    with pytest.raises(Stop):
        run(tmp_path / "b", tmp_path / "b.ckpt", stop_at_20)
    resumed, result = run(tmp_path / "c", tmp_path / "b.ckpt", init=99)
    assert result.start_step == 20
    for k, v in straight.state_dict().items():
        assert torch.equal(v, resumed.state_dict()[k]), k
