"""What the old block rule cost the model: the same model trained the same steps on the same real text, its batches
drawn (a) uniformly from the whole train split (the chapter's ``get_batch``, what training does now) and (b) by the
block rule the model stage used before (below), then validation and test bits per byte of each.

    flock /tmp/wiki-bench.lock .venv/bin/python -m bench.sampler_cost [--steps 400] [--seeds 2]

The text: ``../shared/data``'s WikiText-2 split (articles, at their `` = Title = `` lines) and Tiny Shakespeare
(pieces of about 4 KB, cut at blank lines), in that order: a corpus ordered by topic, as a real one is. Each
document goes to valid, test or train by its sha256 (1/20 each to valid and test); the train documents keep their
order and their ids are cut into ``--shards`` equal shards (24: more than 20, so the block rule shows its phases).
The chapter's word-level BPE (``--merges``) is trained on the train text. Both arms start from the same weights
(seed) and run the same loop (AdamW, warmup + cosine, clipping, fp32 on the CPU); only the sampler differs.

The block rule, stated plainly (the old ``BlockSchedule``, without its merging of blocks shorter than a window,
which never happens here): epoch ``e`` permutes the shards with ``numpy.random.default_rng([seed, e])`` and cuts
the permutation into blocks of 4; a block lasts ``max(1, its tokens // (batch_size * seq_len))`` steps; a step draws
its ``batch_size`` offsets uniformly over its block's tokens (the block's shards concatenated in index order), from
the same batch generator as the uniform arm.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import time

import numpy as np
import torch

from flows.mirror import REPO, SHARED_DATA

OUT = REPO / "bench" / "out"
BLOCK_SHARDS = 4
_TITLE = re.compile(r"^ = [^=].* = $", re.MULTILINE)


def documents() -> list[str]:
    """WikiText-2's articles, then Tiny Shakespeare in pieces of about 4 KB (cut at blank lines), in order."""
    wiki = (SHARED_DATA / "wikitext2-valid.txt").read_text(encoding="utf-8")
    starts = [m.start() for m in _TITLE.finditer(wiki)] + [len(wiki)]
    docs = [wiki[a:b] for a, b in zip(starts, starts[1:]) if wiki[a:b].strip()]
    piece = ""
    for para in (SHARED_DATA / "tinyshakespeare.txt").read_text(encoding="utf-8").split("\n\n"):
        piece += para + "\n\n"
        if len(piece) >= 4096:
            docs.append(piece)
            piece = ""
    return [*docs, piece] if piece else docs


def split_of(doc: str) -> str:
    bucket = int.from_bytes(hashlib.sha256(doc.encode("utf-8")).digest()[:4], "big") % 20
    return {0: "valid", 1: "test"}.get(bucket, "train")


def block_offsets(counts: list[int], seed: int, batch_size: int, seq_len: int, steps: int, gen: torch.Generator):
    """The block rule: step ``s``'s windows, for ``s = 1..steps``, each ``(block, k, offset)``: it starts
    ``offset`` tokens into the block's ``k``-th shard and reads on into the block's next shards."""
    per_step = batch_size * seq_len
    schedule: list[tuple[int, ...]] = []  # the block of each step
    epoch = 0
    while len(schedule) < steps:
        order = np.random.default_rng([seed, epoch]).permutation(len(counts)).tolist()
        for i in range(0, len(order), BLOCK_SHARDS):
            block = tuple(sorted(order[i : i + BLOCK_SHARDS]))
            schedule += [block] * max(1, sum(counts[j] for j in block) // per_step)
        epoch += 1
    for block in schedule[:steps]:
        lengths = [counts[j] for j in block]
        within = torch.randint(sum(lengths) - seq_len, (batch_size,), generator=gen).tolist()
        out = []
        for w in within:  # a position in the block's concatenation -> the split's position (a window may cross
            k = 0  # from one shard of the block to the next, as before; it reads the block's next shard there)
            while w >= lengths[k]:
                w -= lengths[k]
                k += 1
            out.append((block, k, w))
        yield out


def train_arm(rule: str, args, vocab: int, train_shards: list[np.ndarray], held: dict, token_bytes, seed: int):
    from mygpt.gpt_config import GPTConfig
    from mygpt.heldout import heldout_loss
    from mygpt.model import GPT
    from mygpt.training.config import TrainConfig, lr_at
    from mygpt.training.data import ConcatTokens, get_batch

    config = TrainConfig(
        steps=args.steps, lr=args.lr, schedule="cosine", warmup=args.steps // 10, max_grad_norm=1.0, seed=seed
    )
    torch.manual_seed(seed)
    model = GPT(
        GPTConfig(
            vocab_size=vocab,
            embed_dim=args.embed_dim,
            num_layers=args.layers,
            num_heads=4,
            num_kv_heads=2,
            max_seq_len=args.seq_len,
            norm_type="rms",
            position_type="rope",
        )
    )
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=config.weight_decay)
    gen = torch.Generator().manual_seed(seed)
    whole = ConcatTokens(train_shards)
    B, T = args.batch_size, args.seq_len
    blocks = block_offsets([len(s) for s in train_shards], seed, B, T, args.steps, gen) if rule == "blocks" else None
    seen_shards: set[int] = set()
    losses = []
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        if blocks is None:
            x, y = get_batch(whole, B, T, gen)
            seen_shards.update(range(len(train_shards)))
        else:
            windows = []
            for block, k, w in next(blocks):
                view = ConcatTokens([train_shards[j] for j in block[k:]])
                windows.append(np.asarray(view[w : w + T + 1]).astype(np.int64))
                seen_shards.update(block)
            t = torch.from_numpy(np.stack(windows))
            x, y = t[:, :-1].contiguous(), t[:, 1:].contiguous()
        for g in opt.param_groups:
            g["lr"] = lr_at(config, step)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    seconds = time.perf_counter() - t0
    result = {"rule": rule, "seed": seed, "seconds": round(seconds, 1), "shards_read": len(seen_shards)}
    result["train_loss_last50"] = round(float(np.mean(losses[-50:])), 4)
    for split, ids in held.items():
        h = heldout_loss(model, ids, token_bytes, T)
        result[f"{split}_bpb"], result[f"{split}_loss"] = round(h.bpb, 4), round(h.loss, 4)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seeds", type=int, default=2, help="seeds per rule (0, 1, ...): the spread is the noise")
    ap.add_argument("--shards", type=int, default=24)
    ap.add_argument("--merges", type=int, default=512)
    ap.add_argument("--embed-dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(OUT / "sampler_cost.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from mygpt.tokenizers.bpe import BPETokenizer

    load_before = os.getloadavg()
    docs = documents()
    text = {s: "".join(d for d in docs if split_of(d) == s) for s in ("train", "valid", "test")}
    tokenizer = BPETokenizer.from_corpus(text["train"], args.merges)
    ids = {s: np.asarray(tokenizer.encode_corpus(t), dtype=np.int64) for s, t in text.items()}
    cuts = np.linspace(0, len(ids["train"]), args.shards + 1).astype(int)
    shards = [ids["train"][a:b] for a, b in zip(cuts, cuts[1:])]
    token_bytes = tokenizer.token_bytes()
    held = {"valid": ids["valid"], "test": ids["test"]}
    epochs = args.steps * args.batch_size * args.seq_len / len(ids["train"])
    print(
        f"{len(docs)} documents; bytes train/valid/test {', '.join(f'{len(t.encode()):,}' for t in text.values())}; "
        f"tokens {', '.join(f'{len(v):,}' for v in ids.values())}; {args.shards} train shards of ~{len(shards[0]):,}"
        f" tokens; vocab {tokenizer.vocab_size}; {args.steps} steps of {args.batch_size} x {args.seq_len} "
        f"= {epochs:.2f} epochs; load average before {load_before[0]:.2f}",
        flush=True,
    )
    results = []
    for seed in range(args.seeds):
        for rule in ("uniform", "blocks"):  # alternating, so the load falls on both alike
            r = train_arm(rule, args, tokenizer.vocab_size, shards, held, token_bytes, seed)
            print(json.dumps(r), flush=True)
            results.append(r)
    load_after = os.getloadavg()
    print("\n| rule | seed | valid bits/byte | test bits/byte | train loss (last 50 steps) | shards read |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['rule']} | {r['seed']} | {r['valid_bpb']:.4f} | {r['test_bpb']:.4f} | "
            f"{r['train_loss_last50']:.4f} | {r['shards_read']}/{args.shards} |"
        )
    for rule in ("uniform", "blocks"):
        mine = [r for r in results if r["rule"] == rule]
        v, t = (float(np.mean([r[k] for r in mine])) for k in ("valid_bpb", "test_bpb"))
        print(f"| {rule} (mean) | | {v:.4f} | {t:.4f} | | |")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1 min)")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"args": vars(args), "results": results, "load": [load_before[0], load_after[0]]}, f, indent=1)
    assert all(math.isfinite(r["valid_bpb"]) for r in results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
