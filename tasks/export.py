"""Stage ``export`` (task ``export_model``): the model version as a Hugging Face directory, proven exact.

A version loads with transformers' ``AutoTokenizer``/``AutoModelForCausalLM`` and no custom code; it is loaded
back and compared with mygpt before it is published (token ids equal, fp32 logits bit-identical on CPU). Only the
chapter's model (RMSNorm + RoPE) maps exactly: the flow refuses others unless ``export.enabled`` is false.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from mygpt.errors import UserError
from tasks.core.report import md_code, md_fence, md_row, md_text, number, summary_table
from tasks.core.settings import Settings
from tasks.core.stage import BuildContext, Stage, stage_task


class ExportSettings(Settings):
    """Whether to export the model for the Hugging Face stack."""

    enabled: bool = Field(
        True,
        description="export the trained model as a transformers directory (needs the "
        "chapter's norm=rms and position=rope)",
    )

    def skipped(self) -> bool:
        return not self.enabled

    def check_against(self, groups) -> None:
        """Refuse model settings that cannot be exported exactly (``mygpt.hf_export.check_exportable``)."""
        if not self.enabled:
            return
        from mygpt.export.model import check_exportable

        model = groups["model"]
        try:
            check_exportable(model.gpt_config(vocab_size=1))
        except UserError as e:
            raise UserError(
                f"export: a model with norm={model.norm!r} and position={model.position!r} cannot be "
                f"exported exactly: {e}; or set export.enabled=false"
            ) from None


#: The most of the test split the export's corpus check reads (whole articles): wikitext-103's is 1.3 MB.
CHECK_TEXT_BYTES = 16 << 20


def build_export(ctx: BuildContext, settings: ExportSettings, corpus: Path, shards: Path, model: Path) -> dict:
    """Export the model version's checkpoint into ``ctx.out`` (written, loaded back and checked by hf_export), then
    prove the exported tokenizer gives the shards' ids on the corpus's test split (:func:`corpus_check`)."""
    from mygpt.export.publish import export_checkpoint

    for leftover in ctx.out.iterdir():  # a crashed attempt's partial files: the export is cheap, start over
        leftover.unlink()
    ctx.progress(0, 1, "writing and checking the export", force=True)
    facts = export_checkpoint(model / "model.ckpt", ctx.out)
    facts["meta"].pop("checkpoint", None)  # a staging path; the manifest's inputs name the model version
    facts.pop("out_dir", None)
    facts.pop("load", None)  # staging paths: the report writes the load lines for where it is published
    facts["check"]["corpus_tokens"] = corpus_check(ctx.out, corpus, shards)
    ctx.log.info(
        "export: %s, max |logit diff| %.2e against mygpt", facts["architecture"], facts["check"]["max_abs_logit_diff"]
    )
    ctx.progress(1, 1, "done", force=True)
    return facts


def corpus_check(out: Path, corpus: Path, shards: Path) -> int | None:
    """For a byte-level export, the tokens of the test split (its first :data:`CHECK_TEXT_BYTES`, whole articles)
    on which the exported tokenizer gave exactly the shards' ids, ``<|endoftext|>`` after each article
    (``RuntimeError`` where it did not: :func:`mygpt.export.verify.check_documents`); None for the chapter's
    word-level kind, which has no special token to cut out of text (the probe covers its vocabulary)."""
    import json

    import numpy as np

    from mygpt.export.publish import TIKTOKEN_FILE
    from mygpt.export.verify import check_documents
    from tasks.core import shard_format
    from tasks.corpora.splits import TEST, split_files
    from tasks.shards import document_ends
    from tasks.store import MANIFEST

    if not (out / TIKTOKEN_FILE).is_file():  # only a byte-level export has one
        return None
    manifest = json.loads((corpus / MANIFEST).read_text(encoding="utf-8"))
    test = {f.split: f for f in split_files(manifest)}[TEST]
    text = (corpus / test.text).read_bytes()
    ends = document_ends(
        corpus, test, len(text), {"tokenizer": {"version": "of the model"}, "corpus": {"version": corpus.name}}
    )
    kept = [int(e) for e in ends if e <= CHECK_TEXT_BYTES] or [int(e) for e in ends[:1]]
    documents = [text[a:b].decode("utf-8") for a, b in zip([0, *kept[:-1]], kept, strict=True)]
    want = np.concatenate([shard_format.read_shard(p) for p in shard_format.shard_paths(shards, TEST)])
    return check_documents(str(out), documents, want, "<|endoftext|>", whole=len(kept) == len(ends))


def report(manifest: dict) -> str:
    m = manifest.get("metrics", {})
    check = m.get("check", {})
    where = f"export/{manifest['version']}"
    files = "\n".join(md_row(md_code(name), f"{info['bytes']:,}") for name, info in m.get("files", {}).items())
    from mygpt.export.publish import load_lines

    load = md_fence("\n".join(load_lines(manifest.get("path", f"artifacts/{where}"))), "python")
    return f"""# Export: {md_text(where)}

Load it with transformers (no custom code):

{load}

{
        summary_table(
            [
                ("architecture", m.get("architecture")),
                ("parameters", f"{m.get('num_params', 0):,}"),
                ("vocab size", f"{m.get('vocab_size', 0):,}"),
                (
                    "checked",
                    f"{check.get('tokenizer_tokens', 0):,} token ids equal to mygpt's; max logit difference "
                    f"{check.get('max_abs_logit_diff', 0):.2e} over {check.get('logit_tokens', 0)} positions",
                ),
                ("versions", ", ".join(f"{k} {v}" for k, v in (m.get("versions") or {}).items())),
            ]
        )
    }

| file | bytes |
|---|---:|
{files}
"""


STAGE = Stage(
    name="export",
    settings=ExportSettings,
    code_version="2",
    build=build_export,
    report=report,
    headline=lambda m: f"max logit diff {number((m.get('check') or {}).get('max_abs_logit_diff'), '.1e')}",
)
export_model = stage_task(STAGE, "export_model", "Export a model version as a transformers directory (or reuse it).")
