"""The wiki-pipeline flow: download Wikipedia, train a BPE tokenizer on it, encode it into token shards, train
mygpt on the shards and sample from the model.

Every parameter has the chapter's default (§28.6-28.7). All of them are checked before any stage runs
(``flows.params.validate``); the prompt is checked against the tokenizer as soon as the bpe stage has it.
Each stage reuses its version when it exists (Prefect shows it as Cached); ``force=["bpe"]`` rebuilds the
bpe stage and, because the downstream versions depend on its build, everything after it. ``only="train"``
runs just that stage against the latest published upstream versions (following their lineage).
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from flows import params as P
from mygpt.errors import UserError
from tasks.bpe import bpe
from tasks.download import DEFAULT_URL, download
from tasks.encode import encode
from tasks.sample import check_prompts, sample
from tasks.stage import StageRef
from tasks.store import ArtifactStore
from tasks.train import train


@flow(name="wiki-pipeline", description=__doc__.split("\n\n")[0], log_prints=True)
def wiki_pipeline(
    # download
    source_url: str = DEFAULT_URL,
    expected_bytes: int | None = None,
    expected_sha256: str | None = None,
    # bpe
    num_merges: int = 1024,
    bpe_train_bytes: int = 50_000_000,
    # encode
    shard_tokens: int = 10_000_000,
    unk_policy: str = "skip",
    workers: int | None = None,
    # train: the model
    embed_dim: int = 192,
    num_layers: int = 4,
    num_heads: int = 6,
    num_kv_heads: int = 2,
    max_seq_len: int = 256,
    norm: str = "rms",
    position: str = "rope",
    # train: the recipe
    steps: int = 10_000,
    batch_size: int = 16,
    seq_len: int = 256,
    lr: float = 1e-3,
    schedule: str = "cosine",
    warmup: int = 500,
    max_grad_norm: float = 1.0,
    print_every: int = 200,
    eval_every: int = 500,
    eval_batches: int = 20,
    checkpoint_every: int = 1000,
    train_splits: str = "train",
    device: str = "auto",
    precision: str = "auto",
    seed: int = 1337,
    threads: int | None = None,
    # sample
    prompt: str | list[str] = "The history of",
    max_new_tokens: int = 200,
    temperature: float = 1.0,
    top_k: int = 40,
    # how to run
    artifacts_dir: str | None = None,
    force: list[str] = [],
    full_check: bool = False,
    only: str | None = None,
) -> dict[str, StageRef]:
    p = P.validate(dict(locals()))
    if p.only:
        return run_only(p)
    root = p.artifacts_dir

    corpus = download(root, **p.stage("download"))
    tokenizer = bpe(root, corpus, **p.stage("bpe"))
    check_prompt(tokenizer, prompt)
    shards = encode(root, corpus, tokenizer, **p.stage("encode"))
    model = train(root, shards, tokenizer, **p.stage("train"))
    samples = sample(root, model, **p.stage("sample"))

    return {"corpus": corpus, "tokenizer": tokenizer, "shards": shards, "model": model, "samples": samples}


def check_prompt(tokenizer: StageRef, prompt) -> None:
    """Refuse a prompt the tokenizer cannot encode at all, before the expensive stages run."""
    from tasks.train import load_tokenizer

    for warning in check_prompts(load_tokenizer(tokenizer["path"]), prompt):
        get_run_logger().warning(warning)


STAGE_FUNCTIONS = {"download": download, "bpe": bpe, "encode": encode, "train": train, "sample": sample}


def latest_upstream(store: ArtifactStore, stage: str) -> dict[str, StageRef]:
    """The inputs of ``stage`` from the latest published versions: the nearest upstream stage's latest
    version, and the versions it was built from for the others (so tokenizer and shards always match)."""
    needed = P.MODULES[stage].SPEC.inputs
    refs: dict[str, StageRef] = {}
    for name in sorted(needed, key=lambda s: list(P.STORE_NAMES.values()).index(s), reverse=True):
        if name in refs:
            continue
        versions = store.versions(name)
        if not versions:
            raise UserError(f"only={stage!r} needs a published {name} version under {store.root}, and there is "
                            "none; run the whole pipeline once first")
        todo = [versions[-1]]
        while todo:
            info = todo.pop()
            refs.setdefault(info.stage, StageRef(stage=info.stage, version=info.version,
                                                 build_id=info.manifest["build_id"], path=str(info.path)))
            for up_name, up in info.manifest.get("inputs", {}).items():
                if up_name in needed and up_name not in refs:
                    try:
                        todo.append(store.get(up_name, up["version"]))
                    except FileNotFoundError:
                        raise UserError(f"{info.stage}/{info.version} was built from {up_name}/{up['version']}, "
                                        "which is no longer published; rerun the whole pipeline") from None
    return {name: refs[name] for name in needed}


def run_only(p: P.PipelineParams) -> dict[str, StageRef]:
    """Run one stage against the latest upstream versions (``only=...``)."""
    stage = p.only
    inputs = latest_upstream(ArtifactStore(p.artifacts_dir), stage)
    get_run_logger().info("only %s: inputs %s", stage,
                          ", ".join(f"{k}/{v['version']}" for k, v in inputs.items()) or "(none)")
    ref = STAGE_FUNCTIONS[stage](p.artifacts_dir, *inputs.values(), **p.stage(stage))
    return {**inputs, P.STORE_NAMES[stage]: ref}


if __name__ == "__main__":
    wiki_pipeline()
