"""The wiki-pipeline flow: download Wikipedia, train a BPE tokenizer on it, encode it into token shards, train
mygpt on the shards, sample from the model and export it for the Hugging Face stack.

One parameter per stage -- its settings, with the chapter's defaults (§28.6-28.7) -- plus the run options. The
first line checks them all (``Pipeline.parse``: a ``UserError`` naming the field, before any stage runs); the
prompt is checked against the tokenizer as soon as the tokenizer exists. Each stage reuses its version when the
artifact store has it (the task run then ends ``Cached``); ``run.force=["tokenizer"]`` rebuilds that stage and,
because downstream versions depend on its build, everything after it; ``run.only="model"`` runs just that
stage against the latest published upstream versions (following their lineage).

Stage tasks are called with ``return_state=True`` and ``.result()``: a reused version comes back as a state
named Cached (see ``tasks.core.stage``), and ``.result()`` is its ``StageRef`` whether it was built or reused.
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from flows.settings import Pipeline
from mygpt.errors import UserError
from tasks import corpus as corpus_stage
from tasks import export as export_stage
from tasks import model as model_stage
from tasks import samples as samples_stage
from tasks import shards as shards_stage
from tasks import tokenizer as tokenizer_stage
from tasks.corpus import CorpusSettings, download_corpus
from tasks.export import ExportSettings, export_model
from tasks.model import ModelSettings, load_tokenizer, train_model
from tasks.samples import SamplesSettings, check_prompts, sample_model
from tasks.core.settings import RunOptions
from tasks.shards import ShardsSettings, encode_shards
from tasks.core.stage import StageRef
from tasks.core.store import STAGES, ArtifactStore
from tasks.tokenizer import TokenizerSettings, train_tokenizer


@flow(name="wiki-pipeline", description=__doc__.split("\n\n")[0], log_prints=True, validate_parameters=False)
def wiki_pipeline(
    corpus: CorpusSettings = CorpusSettings(),
    tokenizer: TokenizerSettings = TokenizerSettings(),
    shards: ShardsSettings = ShardsSettings(),
    model: ModelSettings = ModelSettings(),
    samples: SamplesSettings = SamplesSettings(),
    export: ExportSettings = ExportSettings(),
    run: RunOptions = RunOptions(),
) -> dict[str, StageRef]:
    # Prefect passes JSON objects for these parameters (validate_parameters=False): Pipeline.parse checks them
    # with the stages' own classes and raises UserError naming the field.
    s = Pipeline.parse(corpus=corpus, tokenizer=tokenizer, shards=shards, model=model, samples=samples,
                       export=export, run=run)
    if s.run.only:
        return run_only(s)

    corpus_ref = download_corpus(s.corpus, s.run, return_state=True).result()
    tokenizer_ref = train_tokenizer(corpus_ref, s.tokenizer, s.run, return_state=True).result()
    check_prompt(tokenizer_ref, s.samples)
    shards_ref = encode_shards(corpus_ref, tokenizer_ref, s.shards, s.run, return_state=True).result()
    model_ref = train_model(shards_ref, tokenizer_ref, s.model, s.run, return_state=True).result()
    samples_ref = sample_model(model_ref, s.samples, s.run, return_state=True).result()
    refs = {"corpus": corpus_ref, "tokenizer": tokenizer_ref, "shards": shards_ref, "model": model_ref,
            "samples": samples_ref}
    if s.export.enabled:
        refs["export"] = export_model(model_ref, s.export, s.run, return_state=True).result()
    return refs


def check_prompt(tokenizer: StageRef, samples: SamplesSettings) -> None:
    """Refuse a prompt the tokenizer cannot encode at all, before the expensive stages run."""
    for warning in check_prompts(load_tokenizer(tokenizer["path"]), samples.prompt):
        get_run_logger().warning(warning)


#: Each stage's module (its ``STAGE``: name and inputs) and task, for ``only=``; a task takes its inputs by
#: stage name, then its settings and the run options.
STAGE_TASKS = {m.STAGE.name: (m.STAGE, task) for m, task in [
    (corpus_stage, download_corpus), (tokenizer_stage, train_tokenizer), (shards_stage, encode_shards),
    (model_stage, train_model), (samples_stage, sample_model), (export_stage, export_model)]}


def latest_upstream(store: ArtifactStore, stage: str) -> dict[str, StageRef]:
    """The inputs of ``stage`` from the latest published versions: the nearest upstream stage's latest
    version, and the versions it was built from for the others (so tokenizer and shards always match)."""
    needed = STAGE_TASKS[stage][0].inputs
    refs: dict[str, StageRef] = {}
    for name in sorted(needed, key=STAGES.index, reverse=True):
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


def run_only(s: Pipeline) -> dict[str, StageRef]:
    """Run one stage against the latest upstream versions (``run.only``)."""
    stage = s.run.only
    inputs = latest_upstream(ArtifactStore(s.run.root()), stage)
    get_run_logger().info("only %s: inputs %s", stage,
                          ", ".join(f"{k}/{v['version']}" for k, v in inputs.items()) or "(none)")
    task = STAGE_TASKS[stage][1]
    ref = task(**inputs, settings=getattr(s, stage), run=s.run, return_state=True).result()
    return {**inputs, stage: ref}


if __name__ == "__main__":
    wiki_pipeline()
