"""``only=`` takes the latest upstream version that has what the run asks of it: ``--only shards --param
tokenizer.kind=byte`` takes the latest byte-level tokenizer, never a chapter one published later, and a byte-level
kind's ``--only tokenizer`` takes a corpus with the article index; where none has it, one error says what to run."""

from __future__ import annotations

import itertools

import pytest

from flows.only import asked_of_upstream, latest_upstream
from flows.settings import Pipeline
from mygpt.errors import UserError
from tasks.registry import BY_NAME, code_versions, open_store
from tasks.store import ArtifactStore

_CLOCK = itertools.count(10)  # created_at has whole seconds: give each version its own, in order


def publish(store: ArtifactStore, stage: str, settings: dict, source: dict | None = None, **inputs: dict) -> dict:
    """A version of ``stage`` whose manifest records ``settings`` as the stage's settings class writes them (and
    ``source``, the identity of what it read)."""
    version = f"{stage[0]}{next(_CLOCK)}"
    build = store.open_build(stage, version)
    (build.out / "x").write_text(version)
    lineage = {name: {"stage": name, "version": m["version"], "build_id": m["build_id"]} for name, m in inputs.items()}
    params = BY_NAME[stage].settings(**settings).version_params()
    return build.publish(
        settings=params,
        inputs=lineage,
        code_version=code_versions()[stage],
        extra={"created_at": _timestamp(next(_CLOCK)), **({"source": source} if source else {})},
    )


def _timestamp(seconds: int) -> str:
    """A valid ``created_at``, ``seconds`` after the clock's start (past 59 too)."""
    return f"2026-01-01T{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}Z"


def picked(store, stage: str, **groups) -> dict[str, str]:
    refs = latest_upstream(store, stage, asked_of_upstream(Pipeline.parse(**groups, run={"only": stage})))
    return {k: v["version"] for k, v in refs.items()}


def test_only_takes_the_upstream_of_the_kind_asked_for(tmp_path):
    store = open_store(tmp_path)
    bare = publish(store, "corpus", {})
    indexed = publish(store, "corpus", {"article_index": True})
    byte = publish(store, "tokenizer", {"kind": "byte"}, corpus=indexed)
    chapter = publish(store, "tokenizer", {}, corpus=bare)  # published after the byte one
    assert picked(store, "shards") == {"corpus": bare["version"], "tokenizer": chapter["version"]}
    assert picked(store, "shards", tokenizer={"kind": "byte"}) == {
        "corpus": indexed["version"],
        "tokenizer": byte["version"],
    }
    with pytest.raises(UserError) as e:
        picked(store, "shards", tokenizer={"kind": "byte", "pattern": "gpt4"})
    assert str(e.value) == (
        "only='shards' needs a tokenizer version built with tokenizer.kind='byte' (it has 'chapter'), "
        f"tokenizer.pattern='gpt4' (it has 'gpt2'), corpus.article_index=True (it has None), and none of the 2 "
        f"current one(s) under {store.root} is (the "
        f"latest: tokenizer/{chapter['version']}); the furthest upstream stage to rebuild is "
        "tokenizer: run the pipeline with this run's settings: wiki-pipeline run --param corpus.article_index=true "
        "--param tokenizer.kind=byte --param tokenizer.pattern=gpt4 ... (a whole run rebuilds what differs and reuses "
        "the rest), or rebuild tokenizer first: wiki-pipeline run --only tokenizer --param corpus.article_index=true "
        "--param tokenizer.kind=byte --param tokenizer.pattern=gpt4 ..., or leave those settings out to take the "
        "latest"
    )
    # a later stage follows the lineage: the latest shards whose tokenizer is byte-level, not the newest shards
    byte_shards = publish(store, "shards", {}, corpus=indexed, tokenizer=byte)
    newest = publish(store, "shards", {}, corpus=bare, tokenizer=chapter)
    assert picked(store, "model")["shards"] == newest["version"]
    assert picked(store, "model", tokenizer={"kind": "byte"}) == {
        "shards": byte_shards["version"],
        "tokenizer": byte["version"],
    }
    # the running stage's own settings given with only= are for it, not asked of its inputs
    assert picked(store, "model", model={"steps": 3})["shards"] == newest["version"]


def test_only_tokenizer_of_a_byte_level_kind_takes_a_corpus_with_the_article_index(tmp_path):
    store = open_store(tmp_path)
    bare = publish(store, "corpus", {})
    with pytest.raises(
        UserError, match=r"needs a corpus version built with corpus\.article_index=True \(it has None\)"
    ):
        picked(store, "tokenizer", tokenizer={"kind": "byte"})
    indexed = publish(store, "corpus", {"article_index": True})
    later = publish(store, "corpus", {})
    assert picked(store, "tokenizer", tokenizer={"kind": "byte"}) == {"corpus": indexed["version"]}
    assert picked(store, "tokenizer") == {"corpus": later["version"]} != {"corpus": bare["version"]}


def test_only_shards_with_a_pretrained_source_takes_a_tokenizer_of_that_files_content(tmp_path):
    import hashlib

    store = open_store(tmp_path / "art")
    indexed = publish(store, "corpus", {"article_index": True})
    wanted, other = tmp_path / "a.json", tmp_path / "b.json"
    wanted.write_text('{"a": 1}')
    other.write_text('{"b": 2}')

    def identity(path):
        return {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "bytes": path.stat().st_size}

    kind = {"kind": "pretrained", "source": str(wanted)}
    mine = publish(store, "tokenizer", {**kind}, source=identity(wanted), corpus=indexed)
    publish(store, "tokenizer", {**kind, "source": str(other)}, source=identity(other), corpus=indexed)  # later
    assert picked(store, "shards", tokenizer=kind)["tokenizer"] == mine["version"]
    wanted.write_text('{"a": 3}')  # new content at the same path: no version has it
    with pytest.raises(
        UserError, match=r"needs a tokenizer version built with tokenizer\.source of sha256 [0-9a-f]{64} "
    ):
        picked(store, "shards", tokenizer=kind)


def test_only_asks_every_upstream_stages_fields_given_by_name(tmp_path):
    """``--only model -p shards.shard_tokens=1000`` over shards of 4500 tokens is refused (it would train on them
    while the run's header logs 1000), naming the field, both values and the command that builds such shards; the
    latest shards that have it are taken. A shared flat name given to the stage that runs too (``--only samples -p
    seed=7``) is for it; the same field given by name for the model (``model.seed``) is asked of the model."""
    store = open_store(tmp_path)
    corpus = publish(store, "corpus", {})
    tok = publish(store, "tokenizer", {}, corpus=corpus)
    small = publish(store, "shards", {"shard_tokens": 1000}, corpus=corpus, tokenizer=tok)
    shards = publish(store, "shards", {"shard_tokens": 4500}, corpus=corpus, tokenizer=tok)
    assert picked(store, "model", shards={"shard_tokens": 1000})["shards"] == small["version"]
    assert picked(store, "model", shards={"shard_tokens": 4500})["shards"] == shards["version"]
    with pytest.raises(UserError) as e:
        picked(store, "model", shards={"shard_tokens": 2000})
    assert str(e.value) == (
        "only='model' needs a shards version built with shards.shard_tokens=2000 (it has 4500), and none of the 2 "
        f"current one(s) under {store.root} is (the latest: shards/{shards['version']}); the furthest upstream "
        "stage to rebuild is shards: run the pipeline with this run's settings: wiki-pipeline run --param "
        "shards.shard_tokens=2000 ... (a whole run rebuilds what differs and reuses the rest), or rebuild shards "
        "first: wiki-pipeline run --only shards --param shards.shard_tokens=2000 ..., or leave those settings out to "
        "take the latest"
    )
    model = publish(store, "model", {"seed": 1}, shards=shards, tokenizer=tok)
    flat = Pipeline.group_flat({"seed": 7})  # the CLI's --param seed=7: the model's and the samples' seed
    assert set(flat) == {"model", "samples"}
    assert picked(store, "samples", **flat) == {"model": model["version"]}
    with pytest.raises(UserError, match=r"needs a model version built with model\.seed=7 \(it has 1\)"):
        picked(store, "samples", model={"seed": 7})


def test_only_asks_the_whole_ancestry_not_only_the_direct_inputs(tmp_path):
    """``--only samples -p tokenizer.num_merges=3`` over a model whose tokenizer had 48 merges is refused (the model
    is the samples' only input, but its tokenizer is in its ancestry), and takes an older model whose tokenizer has
    3; likewise a corpus field asked of ``--only model`` and a shards field asked of ``--only export``."""
    store = open_store(tmp_path)
    bare = publish(store, "corpus", {})
    t3 = publish(store, "tokenizer", {"num_merges": 3}, corpus=bare)
    s3 = publish(store, "shards", {}, corpus=bare, tokenizer=t3)
    m3 = publish(store, "model", {}, shards=s3, tokenizer=t3)
    t48 = publish(store, "tokenizer", {"num_merges": 48}, corpus=bare)
    s48 = publish(store, "shards", {"shard_tokens": 777}, corpus=bare, tokenizer=t48)
    m48 = publish(store, "model", {}, shards=s48, tokenizer=t48)
    assert picked(store, "samples") == {"model": m48["version"]}
    assert picked(store, "samples", tokenizer={"num_merges": 3}) == {"model": m3["version"]}
    assert picked(store, "evaluate", tokenizer={"num_merges": 3})["model"] == m3["version"]
    assert picked(store, "export", shards={"shard_tokens": 777}) == {
        "corpus": bare["version"],
        "shards": s48["version"],
        "model": m48["version"],
    }
    with pytest.raises(UserError, match=r"needs a model version built with shards\.shard_tokens=778 \(it has 777\)"):
        picked(store, "export", shards={"shard_tokens": 778})
    with pytest.raises(
        UserError, match=r"needs a shards version built with corpus\.article_index=True \(it has None\)"
    ):
        picked(store, "model", corpus={"article_index": True}, model={"steps": 2})


def test_only_refusal_names_the_furthest_stage_to_rebuild_and_a_command_that_is_accepted(tmp_path):
    """Where no version fits, the refusal names the furthest upstream stage with no fitting version and offers
    ``--only`` of that stage only where that run would itself be accepted; the whole run with the asked settings is
    always offered."""
    store = open_store(tmp_path)
    bare = publish(store, "corpus", {})
    tok = publish(store, "tokenizer", {}, corpus=bare)
    shards = publish(store, "shards", {}, corpus=bare, tokenizer=tok)
    with pytest.raises(UserError) as e:
        picked(store, "model", tokenizer={"kind": "byte"})
    message = str(e.value)
    assert "the furthest upstream stage to rebuild is corpus: run the pipeline with this run's settings: " in message
    assert "wiki-pipeline run --param corpus.article_index=true --param tokenizer.kind=byte ..." in message
    assert "or rebuild corpus first: wiki-pipeline run --only corpus --param corpus.article_index=true ..., " in message
    indexed = publish(store, "corpus", {"article_index": True})
    with pytest.raises(UserError) as e:
        picked(store, "model", tokenizer={"kind": "byte"})
    assert "the furthest upstream stage to rebuild is tokenizer: " in str(e.value)
    assert "or rebuild tokenizer first: wiki-pipeline run --only tokenizer --param" in str(e.value)
    assert picked(store, "tokenizer", tokenizer={"kind": "byte"}) == {"corpus": indexed["version"]}  # as offered
    # the furthest stage with no fitting version, not the nearest: --only shards would be refused (no such tokenizer)
    with pytest.raises(UserError) as e:
        picked(store, "model", tokenizer={"num_merges": 3}, shards={"shard_tokens": 999})
    assert "the furthest upstream stage to rebuild is tokenizer: " in str(e.value)
    assert shards["version"] in str(e.value)
    with pytest.raises(UserError):
        picked(store, "shards", tokenizer={"num_merges": 3}, shards={"shard_tokens": 999})
    # a stage in between: a tokenizer of 3 merges is there, shards from it are not (nor a model)
    publish(store, "model", {}, shards=shards, tokenizer=tok)
    t3 = publish(store, "tokenizer", {"num_merges": 3}, corpus=bare)
    with pytest.raises(UserError) as e:
        picked(store, "samples", tokenizer={"num_merges": 3})
    assert "the furthest upstream stage to rebuild is shards: " in str(e.value)
    assert "or rebuild shards first: wiki-pipeline run --only shards --param tokenizer.num_merges=3 ..., " in str(
        e.value
    )
    assert picked(store, "shards", tokenizer={"num_merges": 3})["tokenizer"] == t3["version"]  # as offered


def test_only_with_the_tiny_preset_asks_only_what_was_typed(tmp_path):
    """``--tiny --only samples`` takes the newest model though it trained 2 steps and the preset says 40: a
    preset's value is not asked of upstream versions (the stage that runs still takes the preset); the same value
    typed with ``--param`` is asked, and ``--param only=...`` counts as ``--only``."""
    from flows.choices import checked
    from flows.cli import build_parser

    store = open_store(tmp_path)
    corpus = publish(store, "corpus", {})
    tok = publish(store, "tokenizer", {"num_merges": 48}, corpus=corpus)
    shards = publish(store, "shards", {}, corpus=corpus, tokenizer=tok)
    forty = publish(store, "model", {"steps": 40}, shards=shards, tokenizer=tok)
    two = publish(store, "model", {"steps": 2}, shards=shards, tokenizer=tok)

    def cli(*argv: str) -> dict[str, str]:
        s = checked(build_parser().parse_args(["run", "--tiny", "--artifacts-dir", str(tmp_path), *argv]))
        refs = latest_upstream(store, s.run.only, asked_of_upstream(s))
        return {k: v["version"] for k, v in refs.items()} | {"max_new_tokens": s.resolved("samples").max_new_tokens}

    assert cli("--only", "samples") == {"model": two["version"], "max_new_tokens": 40}
    assert cli("--param", "only=sample") == {"model": two["version"], "max_new_tokens": 40}
    assert cli("--only", "samples", "-p", "model.steps=40")["model"] == forty["version"]
    assert checked(build_parser().parse_args(["run", "--tiny"])).resolved("model").steps == 40  # a whole run
