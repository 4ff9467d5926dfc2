"""The model comparison compares what can be compared: its chart plots bits per byte (a loss per token is not
comparable across tokenizers), and its table says in words what each version changed (the tokenizer by what it
is, not by its version id), in columns few enough for a laptop's width."""

from __future__ import annotations

import base64
import re
from types import SimpleNamespace

from flows.reports import comparison
from tasks.registry import BY_NAME

TOKENIZERS = {
    "aaaaaaaaaaa1": {"settings": {"kind": "chapter", "num_merges": 1024}, "metrics": {}},
    "bbbbbbbbbbb2": {
        "settings": {"kind": "pretrained", "source": "https://host.example/gpt2/tokenizer.json"},
        "metrics": {"num_merges": 50000, "source": "https://host.example/gpt2/tokenizer.json"},
    },
}
SHARDS = {"ccccccccccc3": {"settings": {"shard_tokens": 100}}, "ddddddddddd4": {"settings": {"shard_tokens": 100}}}


def model(version: str, tokenizer: str, shards: str, loss: float, bpb: float, steps: int = 40) -> SimpleNamespace:
    curve = [[1, loss + 1, None], [20, loss + 0.5, loss + 0.4], [steps, loss, loss]]
    manifest = {
        "created_at": "2026-12-01T22:00:00Z",
        "settings": {"steps": steps, "lr": 0.001},
        "inputs": {"tokenizer": {"version": tokenizer}, "shards": {"version": shards}},
        "metrics": {
            "steps": steps,
            "final_loss": loss,
            "final_val_loss": loss,
            "final_val_bpb": bpb,
            "loss_curve": curve,
        },
    }
    return SimpleNamespace(stage="model", version=version, manifest=manifest)


def lookup(stage: str, version: str) -> dict | None:
    return {"tokenizer": TOKENIZERS, "shards": SHARDS}.get(stage, {}).get(version)


VERSIONS = [
    model("111111111111", "aaaaaaaaaaa1", "ccccccccccc3", loss=4.3, bpb=1.40),
    model("222222222222", "bbbbbbbbbbb2", "ddddddddddd4", loss=9.1, bpb=1.30),
    model("333333333333", "bbbbbbbbbbb2", "ddddddddddd4", loss=8.9, bpb=1.25, steps=80),
]


def chart_svg(md: str) -> str:
    found = re.search(r"data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)\)", md)
    assert found, md
    return base64.b64decode(found.group(1)).decode()


def test_the_chart_plots_bits_per_byte_across_tokenizers():
    md = comparison(BY_NAME["model"], VERSIONS, {}, [])
    assert "![validation bits per byte of the latest 3 model versions]" in md
    svg = chart_svg(md)
    ticks = [float(v) for v in re.findall(r'text-anchor="end">([\d.]+)</text>', svg)]
    assert ticks and max(ticks) < 3, ("bits per byte, about 1.2-1.9; a loss per token would reach 9.5", ticks)
    assert "validation bits per byte" in svg


def test_the_table_says_what_changed_in_words():
    md = comparison(BY_NAME["model"], VERSIONS, {}, [], lookup=lookup)
    rows = {line.split("`")[1]: line for line in md.splitlines() if re.match(r"^- `\d{12}` \(built ", line)}
    assert "tokenizer: chapter 1,024 merges → pretrained gpt2/tokenizer.json (50,000 merges)" in rows["222222222222"]
    assert "shards" not in rows["222222222222"], "rebuilt because the tokenizer changed: not news"
    assert "steps 40 → 80" in rows["333333333333"] and "tokenizer" not in rows["333333333333"]
    assert "the first" in rows["111111111111"]
    for hashed in (*TOKENIZERS, *SHARDS):
        assert hashed not in md, "inputs named by what they are, not by their version id"
    header = next(line for line in md.splitlines() if line.startswith("| version"))
    assert "built" not in header and "changed" not in header, "the words sit below the table, not in a column"
