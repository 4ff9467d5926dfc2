"""The token-shard format of the ``shards`` stage: plain Parquet files (:data:`SCHEMA`)."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import NamedTuple

import numpy as np

from mygpt.atomic import atomic_open, atomic_write_bytes
from mygpt.errors import UserError

COLUMN = "token_id"
COMPRESSION = "zstd"  # default level; ~1/3 of the raw uint16 size on Wikipedia tokens, fast to decode
ROW_GROUP_TOKENS = 1 << 20  # 1 Mi tokens per row group: readers can stream a shard in ~2 MiB pieces
SHARD_NAME = "{split}-{index:05d}.parquet"
_SPLIT_RE = re.compile(r"^[a-z][a-z0-9_]*$")  # a split's name, as the corpus manifest lists it
_SHARD_RE = re.compile(r"^([a-z][a-z0-9_]*)-(\d{5})\.parquet$")

SCHEMA = f"""\
Token shards (stage `shards`)
=============================

Files: `{{split}}-{{index:05d}}.parquet` for each split of the corpus version (train, valid and test for
wikitext; the manifest's `split_names`), e.g. `train-00000.parquet`, numbered from 00000 with no gaps.
Concatenating a split's shards in index order gives the token ids of that split's text file in the corpus
version, encoded with the tokenizer version
(`BPETokenizer.encode_corpus`; characters outside the tokenizer's alphabet are skipped and counted in the
manifest metrics).

Each shard is a Parquet file (written by pyarrow) with exactly one column:

| column     | Parquet/Arrow type                                          | nullable |
|------------|-------------------------------------------------------------|----------|
| `{COLUMN}` | uint16 when the tokenizer's vocab_size <= 65536, else uint32 | no       |

Every shard of a split holds exactly `shard_tokens` rows except the last one, which holds the rest
(1..shard_tokens rows; a split with no tokens at all has one empty shard). Row order is token order.
Compression: {COMPRESSION} (default level) with Parquet dictionary encoding, row groups of
{ROW_GROUP_TOKENS:,} rows.

`shards.json` lists every shard with its token count and the offsets of its first and last token within
the split; the version's `manifest.json` has every file's size and sha256.

Reading without this project:

    pyarrow: pyarrow.parquet.read_table("train-00000.parquet")["{COLUMN}"].to_numpy()
    pandas:  pandas.read_parquet("train-00000.parquet")["{COLUMN}"]
    duckdb:  SELECT {COLUMN} FROM read_parquet('train-*.parquet', filename=true)
             ORDER BY filename, file_row_number   -- or read the files one by one in name order
"""


def arrow_type(dtype):
    import pyarrow as pa

    dtype = np.dtype(dtype)
    if dtype == np.uint16:
        return pa.uint16()
    if dtype == np.uint32:
        return pa.uint32()
    raise ValueError(f"token shards hold uint16 or uint32 ids, not {dtype}")


def dtype_for_vocab(vocab_size: int):
    return np.dtype(np.uint16 if vocab_size <= 65536 else np.uint32)


def shard_name(split: str, index: int) -> str:
    return SHARD_NAME.format(split=split, index=index)


class WrittenShard(NamedTuple):
    size: int
    sha256: str


def shard_bytes(ids: np.ndarray) -> bytes:
    """The Parquet file of ``ids`` (a 1-D uint16 or uint32 array) as bytes: they depend only on ``ids`` (and
    pyarrow). The column is made from ``ids``'s buffer as it is: ``pa.array`` on a numpy array would import pandas
    (seconds in a fresh process) only to ask whether it was handed a pandas object."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = np.ascontiguousarray(ids)
    if ids.ndim != 1:
        raise ValueError(f"a shard holds a 1-D array of token ids, got shape {ids.shape}")
    schema = pa.schema([pa.field(COLUMN, arrow_type(ids.dtype), nullable=False)])
    column = pa.Array.from_buffers(schema.field(0).type, ids.size, [None, pa.py_buffer(ids)])
    sink = pa.BufferOutputStream()
    pq.write_table(
        pa.Table.from_arrays([column], schema=schema),
        sink,
        compression=COMPRESSION,
        use_dictionary=True,
        row_group_size=ROW_GROUP_TOKENS,
        write_statistics=True,
    )
    return sink.getvalue().to_pybytes()


def write_shard(path: str | os.PathLike, ids: np.ndarray) -> WrittenShard:
    """Write ``ids`` as one shard, atomically; its size and sha256, from the bytes written (the file is not read
    back to hash it)."""
    data = shard_bytes(ids)
    atomic_write_bytes(path, data)
    return WrittenShard(len(data), hashlib.sha256(data).hexdigest())


def shard_tokens_in(path: str | os.PathLike) -> int:
    """Number of tokens in a shard, from the Parquet footer (cheap)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def read_shard(path: str | os.PathLike) -> np.ndarray:
    """A shard's token ids as a 1-D numpy array (uint16 or uint32), read batch by batch (``pq.read_table`` would
    import pandas)."""
    import pyarrow.parquet as pq

    source = pq.ParquetFile(path)
    dtype = np.dtype(source.schema_arrow.field(COLUMN).type.to_pandas_dtype())
    batches = source.iter_batches(batch_size=ROW_GROUP_TOKENS, columns=[COLUMN])
    parts = [_ids(b.column(0), os.fspath(path)) for b in batches]
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


def shard_paths(shards_dir: str | os.PathLike, split: str) -> list[Path]:
    """A split's shard files in index order; ``UserError`` when there are none or the numbering has a gap."""
    if not _SPLIT_RE.match(split):
        raise UserError(f"split must be a split's name (lower-case letters, digits, _), like train, got {split!r}")
    shards_dir = Path(shards_dir)
    found = {}
    for p in shards_dir.glob(f"{split}-*.parquet"):
        m = _SHARD_RE.match(p.name)
        if m:
            found[int(m.group(2))] = p
    if not found:
        raise UserError(
            f"no {split} shards ({split}-00000.parquet ...) in {shards_dir}; "
            "point at a published version of the shards stage"
        )
    missing = sorted(set(range(max(found) + 1)) - set(found))
    if missing:
        raise UserError(
            f"{shards_dir} is missing shard {shard_name(split, missing[0])}; "
            "the version is incomplete: rebuild the shards stage"
        )
    return [found[i] for i in sorted(found)]


def _write_flat(path, dtype: np.dtype, f, name: object = None) -> int:
    """Append the shard ``path`` (a path or an open Parquet file)'s ids to the open file ``f`` as flat ``dtype``
    (native order); how many. ``name``: what errors call it (default: ``path``)."""
    import pyarrow.parquet as pq

    written = 0
    source = path if isinstance(path, pq.ParquetFile) else pq.ParquetFile(path)
    for batch in source.iter_batches(batch_size=ROW_GROUP_TOKENS, columns=[COLUMN]):
        arr = _ids(batch.column(0), name or path).astype(dtype, copy=False)
        f.write(arr.data)  # the array's own buffer: no copy of it as bytes
        written += arr.size
    return written


def _ids(column, name: object) -> np.ndarray:
    """A null-free uint16/uint32 Arrow array's values as a numpy view of its buffer: ``Array.to_numpy`` would
    import pandas (seconds and tens of MB in a process that has not) only to ask whether it needs it.
    ``UserError`` naming the shard ``name`` when the column is of another type or holds nulls (not what
    :data:`SCHEMA` writes: a damaged or foreign file, whose buffer would be misread)."""
    kind = str(column.type)
    if kind not in ("uint16", "uint32"):
        raise _not_a_shard(name, f"its {COLUMN} column is of type {kind}, a shard's is uint16 or uint32")
    if column.null_count:
        raise _not_a_shard(name, f"its {COLUMN} column holds {column.null_count:,} null(s), a shard's holds none")
    dtype = np.dtype(column.type.to_pandas_dtype())
    return np.frombuffer(column.buffers()[1], dtype=dtype, count=len(column), offset=column.offset * dtype.itemsize)


def _not_a_shard(name: object, what: str) -> UserError:
    return UserError(
        f"{name} is not a token shard as the shards stage writes it ({what}); rebuild the shards "
        "(run with --force shards)"
    )


def flatten_shard(
    shard: str | os.PathLike | bytes, dest: str | os.PathLike, dtype, tokens: int, name: str = ""
) -> None:
    """The shard ``shard`` (a path, or its bytes: what was checked is what is read) as one flat native-order token
    file ``dest`` (atomically, not durably: the training's scratch cache, whose files a killed run's successor
    deletes unread, so an fsync would only make the first step wait for the disk): how training reads a shard it
    fetched. ``UserError`` naming ``name`` (default: the path) when it holds another type or count than its index
    says."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    dtype = np.dtype(dtype)
    if isinstance(shard, bytes):
        source, name = pq.ParquetFile(pa.BufferReader(shard)), name or "the shard"
    else:
        source, name = pq.ParquetFile(shard), name or os.fspath(shard)
    got = np.dtype(source.schema_arrow.field(COLUMN).type.to_pandas_dtype())
    if got != dtype:
        raise UserError(f"{name} has token type {got}, its index says {dtype}; rebuild the shards")
    with atomic_open(dest, "wb", durable=False) as f:
        written = _write_flat(source, dtype, f, name)
        if written != tokens:
            raise UserError(f"{name} holds {written:,} tokens, its index says {tokens:,}; rebuild the shards")
