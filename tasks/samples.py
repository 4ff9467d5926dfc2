"""Stage ``samples`` (task ``sample_model``): ``model/<version>/model.ckpt`` -> ``samples.md`` + ``samples.json``.

Every prompt is sampled with the same ``seed``, so a version always holds the same text and a continuation does
not depend on the prompt's place in the list; characters the tokenizer cannot encode are dropped, with a warning.
A byte-level model's continuation ends where it samples ``<|endoftext|>`` (``stopped_at``; the report marks the
place), as Hugging Face's ``generate`` ends at the EOS token.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import Field, field_validator

from mygpt.errors import UserError
from tasks.core.report import Markdown, bidi_isolated, md_code, md_text
from tasks.core.settings import DeviceSettings, Seed
from tasks.core.stage import BuildContext, Stage, StageRef, stage_task

MIN_TEMPERATURE = 0.001
MAX_TEMPERATURE = 100.0
#: The most tokens a continuation may ask for: 300 times the chapter's 200, a long chapter of text shown whole in
#: the UI artifact; without a bound ``max_new_tokens=10**12`` sampled until killed.
MAX_NEW_TOKENS = 1 << 16
#: Past any vocabulary (token ids are 32-bit, and a vocabulary is this size at most where top-k means anything):
#: a larger top_k is 0 ("all") written another way, refused rather than taken.
MAX_TOP_K = 1 << 24


class SamplesSettings(DeviceSettings):
    """What to generate (the chapter's §28.7): prompts, length, sampling. ``device``/``precision``: DeviceSettings."""

    TEXT_FIELDS = frozenset({"prompt"})

    prompt: tuple[str, ...] = Field(
        ("The history of",), strict=False, description="one prompt or a list of them; the chapter uses 'The history of'"
    )
    max_new_tokens: int = Field(
        200, ge=1, le=MAX_NEW_TOKENS, description="tokens to generate after each prompt; the chapter uses 200"
    )
    temperature: float = Field(1.0, description="sampling temperature; 0 = greedy; the chapter uses 1.0")
    top_k: int = Field(
        40, ge=0, le=MAX_TOP_K, description="sample from the k most likely tokens; 0 = all; the chapter uses 40"
    )
    seed: Seed = Field(1337, description="sampling seed: the same version always holds the same text")

    @field_validator("temperature")
    @classmethod
    def _sane_temperature(cls, value: float) -> float:
        # logits / temperature: far below MIN_TEMPERATURE sampling is greedy anyway, and near 1e-38 the division
        # overflows to inf (then NaN probabilities); far above MAX_TEMPERATURE it is uniform noise.
        if not (value == 0 or MIN_TEMPERATURE <= value <= MAX_TEMPERATURE):
            raise ValueError(
                f"temperature must be 0 (greedy) or from {MIN_TEMPERATURE} to {MAX_TEMPERATURE:g}, "
                f"got {value!r} (the chapter uses 1.0)"
            )
        return value

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompts(cls, value):
        prompts = [value] if isinstance(value, str) else value
        if not isinstance(prompts, (list, tuple)) or not prompts or not all(isinstance(p, str) for p in prompts):
            raise ValueError(f"prompt must be a string or a non-empty list of strings, got {value!r}")
        empty = [p for p in prompts if not p.strip()]
        if empty:
            raise ValueError(
                f"prompt {empty[0]!r} is empty; give some text to continue (the chapter uses 'The history of')"
            )
        return tuple(prompts)


def usable_prompt(tokenizer, prompt: str) -> tuple[str, list[str]]:
    """``(prompt without the characters the tokenizer cannot encode, those characters)``."""
    unknown = tokenizer.unknown_chars(prompt)
    return "".join(c for c in prompt if c not in set(unknown)), unknown


def build_samples(ctx: BuildContext, settings: SamplesSettings, model: Path) -> dict:
    """Generate from the checkpoint, one seeded continuation per prompt; write samples.md and samples.json."""
    import time

    from mygpt.checkpoint import load_checkpoint
    from mygpt.device import torch_threads
    from mygpt.errors import describe_chars
    from mygpt.generate import generate_sample

    s = settings
    gpt, tokenizer = load_checkpoint(model / "model.ckpt")
    check_prompts(tokenizer, s.prompt)  # the flow checked already, but only= and plain calls skip that
    samples = []
    for i, prompt in enumerate(s.prompt):
        usable, unknown = usable_prompt(tokenizer, prompt)
        if unknown:
            ctx.log.warning(
                "samples: dropping characters the tokenizer cannot encode from prompt %r: %s",
                prompt,
                describe_chars(unknown),
            )
        t0 = time.perf_counter()
        with torch_threads(ctx.run.threads):
            made = generate_sample(
                gpt,
                tokenizer,
                usable,
                max_new_tokens=s.max_new_tokens,
                temperature=s.temperature,
                top_k=s.top_k,
                seed=s.seed,
                device=s.device,
                precision=s.precision,
            )
        samples.append(
            {
                "prompt": prompt,
                "used_prompt": usable,
                "continuation": made.text[len(usable) :],
                "new_tokens": made.new_tokens,
                "stopped_at": made.stopped_at,
                "seconds": round(time.perf_counter() - t0, 3),
            }
        )
        ctx.progress(i + 1, len(s.prompt), f"prompt {i + 1}/{len(s.prompt)}")
    p = s.version_params()
    (ctx.out / "samples.json").write_text(json.dumps(samples, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (ctx.out / "samples.md").write_text(samples_markdown(samples, p), encoding="utf-8")
    return {"samples": samples, "device": s.device, "precision": s.precision}


def samples_markdown(samples: list[dict], p: dict) -> str:
    """The samples as markdown: one blockquote per prompt, the prompt in bold, markdown syntax escaped."""
    parts = [
        md_text(
            f"up to {p['max_new_tokens']} tokens per prompt, temperature {p['temperature']}, top-k {p['top_k']}, "
            f"seed {p['seed']}, device {p['device']} ({p['precision']}). The prompt is in bold."
        )
        + "\n"
    ]
    for i, s in enumerate(samples, 1):
        note = (
            f" (characters the tokenizer cannot encode dropped: used {md_code(repr(s['used_prompt']))})"
            if s["used_prompt"] != s["prompt"]
            else ""
        )
        prompt = s["used_prompt"]
        core = prompt.strip()  # ** must hug the text to render as bold
        lead, tail = prompt[: len(prompt) - len(prompt.lstrip())], prompt[len(prompt.rstrip()) :]
        lead, core, tail, more = (md_text(part, one_line=False) for part in (lead, core, tail, s["continuation"]))
        end = stop_note(s)
        text = f"{lead}**{core}**{tail}{more}{end}"  # each part escaped: a line that starts in it begins no block
        # each line's bidi isolated: a generated override reverses its own line, not the quote's markup
        quote = "\n".join(f"> {bidi_isolated(line)}  " for line in text.split("\n"))
        parts.append(f"## {i}. {bidi_isolated(md_text(s['prompt']))}{note}\n\n{quote}\n")
    return "\n".join(parts)


def stop_note(sample: dict) -> Markdown:
    """Where a continuation ended at a special token: that token as code and how many tokens came before it
    (empty when ``max_new_tokens`` ran out, or for a version made before the stage recorded it)."""
    if not sample.get("stopped_at"):
        return Markdown("")
    n = sample["new_tokens"] - 1
    return md_text(f" [{sample['stopped_at']}] (the model ended the text here, after {n} token{'s' * (n != 1)})")


def report(manifest: dict) -> str:
    where = manifest.get("path", f"samples/{manifest['version']}")
    return (
        f"# Samples: samples/{md_text(manifest['version'])}\n\n"
        + samples_markdown(manifest["metrics"]["samples"], manifest["settings"])
        + f"\nFiles: {md_code(f'{where}/samples.md')}, {md_code(f'{where}/samples.json')}\n"
    )


def check_prompts(tokenizer, prompt) -> list[str]:
    """Refuse prompts made only of characters ``tokenizer`` cannot encode; warnings for those that contain some."""
    from mygpt.errors import describe_chars

    warnings = []
    for text in [prompt] if isinstance(prompt, str) else prompt:
        usable, unknown = usable_prompt(tokenizer, text)
        if unknown and not usable.strip():
            raise UserError(
                f"prompt {text!r} is made only of characters the tokenizer cannot encode "
                f"({describe_chars(unknown)}), so there is nothing to continue; use text in the "
                "corpus's alphabet"
            )
        if unknown:
            warnings.append(
                f"prompt {text!r}: the tokenizer cannot encode {describe_chars(unknown)}; the samples stage drops them"
            )
    return warnings


def check_prompt_early(settings: SamplesSettings, tokenizer: StageRef) -> list[str]:
    """The samples' early check (:attr:`Stage.early_check`): the prompt against the tokenizer version."""
    from tasks.core.stage import ref_dir
    from tasks.tokenizer import load_tokenizer

    return check_prompts(load_tokenizer(ref_dir(tokenizer)), settings.prompt)


STAGE = Stage(
    name="samples",
    settings=SamplesSettings,
    code_version="3",
    build=build_samples,
    report=report,
    early_check=("tokenizer", check_prompt_early),
    alias="sample",
    headline=lambda m: f"{len(m.get('samples') or [])} sample(s)",
    shared_flat=("seed", "device", "precision"),
    tiny={"max_new_tokens": 40},
)
sample_model = stage_task(STAGE, "sample_model", "Sample text from a model version (or reuse that version).")
