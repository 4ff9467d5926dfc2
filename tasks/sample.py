"""Stage 5, sample: ``model/<version>/model.ckpt`` -> ``samples/<version>/samples.md`` (+ ``samples.json``).

Generates ``max_new_tokens`` BPE tokens after each prompt (the chapter's §28.7: "The history of", 200 tokens,
temperature 1.0, top-k 40), seeded, so the same version always holds the same text. Every prompt is sampled with
the same ``seed``, so a prompt's continuation does not depend on its place in the list. Characters the tokenizer
cannot encode are dropped from a prompt with a warning (the flow already refused prompts made only of them).
"""

from __future__ import annotations

import json
import os
import re

from mygpt.errors import UserError
from tasks.stage import StageRef, StageSpec, call_stage, stage_task
from tasks.train import check_threads, resolve_device_params, torch_threads

CODE_VERSION = "1"
DEFAULTS = dict(prompt=["The history of"], max_new_tokens=200, temperature=1.0, top_k=40, seed=1337,
                device="auto", precision="auto")


def prompts_of(prompt) -> list[str]:
    """A prompt parameter (one string or a list of strings) as a list."""
    return [prompt] if isinstance(prompt, str) else list(prompt)


def usable_prompt(tokenizer, prompt: str) -> tuple[str, list[str]]:
    """``(prompt without the characters the tokenizer cannot encode, those characters)``."""
    unknown = tokenizer.unknown_chars(prompt)
    return "".join(c for c in prompt if c not in set(unknown)), unknown


def build(ctx) -> dict:
    import time

    from mygpt.bpe import describe_chars
    from mygpt.checkpoint import load_checkpoint
    from mygpt.generate import generate

    p = ctx.params
    model, tokenizer = load_checkpoint(ctx.input_path("model") / "model.ckpt")
    check_prompts(tokenizer, p["prompt"])  # the flow checked already, but only= and plain calls skip that
    samples = []
    for i, prompt in enumerate(p["prompt"]):
        usable, unknown = usable_prompt(tokenizer, prompt)
        if unknown:
            ctx.log.warning("sample: dropping characters the tokenizer cannot encode from prompt %r: %s",
                            prompt, describe_chars(unknown))
        t0 = time.perf_counter()
        with torch_threads(ctx.options.get("threads")):
            text = generate(model, tokenizer, usable, max_new_tokens=p["max_new_tokens"],
                            temperature=p["temperature"], top_k=p["top_k"], seed=p["seed"], device=p["device"],
                            precision=p["precision"])
        samples.append({"prompt": prompt, "used_prompt": usable, "continuation": text[len(usable):],
                        "seconds": round(time.perf_counter() - t0, 3)})
        ctx.progress(i + 1, len(p["prompt"]), f"prompt {i + 1}/{len(p['prompt'])}")
    (ctx.out / "samples.json").write_text(json.dumps(samples, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (ctx.out / "samples.md").write_text(samples_markdown(samples, p), encoding="utf-8")
    return {"samples": samples, "device": p["device"], "precision": p["precision"]}


_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>#|~])")


def _escape(text: str) -> str:
    return _MD_SPECIAL.sub(r"\\\1", text)


def samples_markdown(samples: list[dict], p: dict) -> str:
    """The samples as markdown: one blockquote per prompt, the prompt in bold, markdown syntax escaped."""
    parts = [f"{p['max_new_tokens']} tokens per prompt, temperature {p['temperature']}, top-k {p['top_k']}, "
             f"seed {p['seed']}, device {p['device']} ({p['precision']}). The prompt is in bold.\n"]
    for i, s in enumerate(samples, 1):
        note = f" (characters the tokenizer cannot encode dropped: used {s['used_prompt']!r})" \
            if s["used_prompt"] != s["prompt"] else ""
        prompt = s["used_prompt"]
        core = prompt.strip()  # ** must hug the text to render as bold
        lead, tail = prompt[:len(prompt) - len(prompt.lstrip())], prompt[len(prompt.rstrip()):]
        text = f"{lead}**{_escape(core)}**{tail}{_escape(s['continuation'])}"
        quote = "\n".join(f"> {line}  " for line in text.split("\n"))
        parts.append(f"## {i}. {_escape(s['prompt'])}{note}\n\n{quote}\n")
    return "\n".join(parts)


def report(manifest: dict) -> str:
    where = manifest.get("path", f"samples/{manifest['version']}")
    return (f"# Samples: samples/{manifest['version']}\n\n"
            + samples_markdown(manifest["metrics"]["samples"], manifest["params"])
            + f"\nFiles: `{where}/samples.md`, `{where}/samples.json`\n")


SPEC = StageSpec(name="samples", task_name="sample", artifact_key="wiki-samples", code_version=CODE_VERSION,
                 build=build, report=report, inputs=("model",))
TASK = stage_task(SPEC)


def validate(threads: int | None = None, **params) -> dict:
    """Check the sample parameters (``UserError`` naming the parameter); return the version parameters:
    ``DEFAULTS`` filled in, ``prompt`` as a list, ``device``/``precision`` resolved. ``threads``: run option."""
    check_threads(threads)
    unknown = sorted(set(params) - set(DEFAULTS))
    if unknown:
        raise UserError(f"unknown sample parameter(s) {unknown}; known: {', '.join(DEFAULTS)}")
    p = {**DEFAULTS, **params}
    prompts = p["prompt"]
    if isinstance(prompts, str):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)) or not prompts or not all(isinstance(x, str) for x in prompts):
        raise UserError(f"prompt must be a string or a non-empty list of strings, got {p['prompt']!r}")
    empty = [x for x in prompts if not x.strip()]
    if empty:
        raise UserError(f"prompt {empty[0]!r} is empty; give some text to continue (the chapter uses "
                        "'The history of')")
    p["prompt"] = list(prompts)
    n = p["max_new_tokens"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UserError(f"max_new_tokens must be an integer >= 1, got {n!r}")
    t = p["temperature"]
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < float("inf"):
        raise UserError(f"temperature must be a number >= 0 (0 = greedy), got {t!r}")
    p["temperature"] = float(t)
    k = p["top_k"]
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise UserError(f"top_k must be an integer >= 0 (0 = no top-k filtering), got {k!r}")
    if isinstance(p["seed"], bool) or not isinstance(p["seed"], int):
        raise UserError(f"seed must be an integer, got {p['seed']!r}")
    return resolve_device_params(p)


def check_prompts(tokenizer, prompt) -> list[str]:
    """Refuse prompts made only of characters ``tokenizer`` cannot encode (known right after the bpe stage).

    Returns warnings for prompts that merely contain some (the sample stage drops those characters)."""
    from mygpt.bpe import describe_chars

    warnings = []
    for text in prompts_of(prompt):
        usable, unknown = usable_prompt(tokenizer, text)
        if unknown and not usable.strip():
            raise UserError(f"prompt {text!r} is made only of characters the tokenizer cannot encode "
                            f"({describe_chars(unknown)}), so there is nothing to continue; use text in the "
                            "corpus's alphabet")
        if unknown:
            warnings.append(f"prompt {text!r}: the tokenizer cannot encode {describe_chars(unknown)}; "
                            "the sample stage drops them")
    return warnings


def sample(artifacts_dir: str | os.PathLike, model: StageRef, *, threads: int | None = None, force: bool = False,
           full_check: bool = False, **params) -> StageRef:
    """Run (or reuse) the sample stage: the ``sample`` task inside a flow, a plain call outside one.
    ``params``: any of ``DEFAULTS``; ``threads`` (torch CPU threads) is a run option, not in the version."""

    return call_stage(SPEC, TASK, artifacts_dir, validate(threads, **params), {"model": model}, force=force,
                      full_check=full_check, options={"threads": threads} if threads else None)
