"""The flow's own UI artifacts, published when a run ends: ``wiki-run-summary`` (each stage built or Cached, its
version, time, size and headline) and ``wiki-<stage>-comparison-<root>`` for every stage with columns (every
version published under that artifact root side by side, from the store's manifests, whichever run built it)."""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tasks.core.report import Markdown, human_bytes, md_code, md_row, md_text
from tasks.core.stage import Column, Stage
from tasks.core.urls import redact_text, redact_url
from tasks.registry import BY_NAME, STAGES, open_store
from tasks.store import ArtifactStore, VersionInfo

SUMMARY_KEY = "wiki-run-summary"
HOW_TO_READ = "Newest first; below the table, what each version changed from the one before it, in words.\n\n"
#: ``(stage, version) -> manifest or None``: how a comparison reads an input version's manifest (its words).
Lookup = Callable[[str, str], "dict | None"]


@dataclass(frozen=True)
class Outcome:
    """One stage of a run: ``state`` is the task run's final state name (``Cached`` when reused, ``Completed`` when
    built); ``version`` is empty for a stage that did not finish."""

    stage: str
    version: str
    state: str
    seconds: float

    @property
    def verdict(self) -> str:
        """``built``, ``Cached``, or how the stage ended when it did not finish (``Failed``, ``Crashed``)."""
        return {"Cached": "Cached", "Completed": "built"}.get(self.state, self.state)


#: What a stage's formatter raises on a metric of another type than it reads (a string where it formats a number,
#: a dict where it reads a list, a curve point that is not a triple): the manifest's schema checks only that
#: ``metrics`` is an object, so such a value costs its own cell (``–``) or its curve, never a report. Any other
#: exception is a bug of the formatter, and is raised.
BAD_VALUE = (TypeError, ValueError, KeyError, AttributeError, IndexError)


def _logger() -> logging.Logger | logging.LoggerAdapter:
    """The flow run's logger (the warning shows in the run's log in the UI), or outside a run this module's."""
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("wiki_pipeline.reports")


def _bad_value(where: str, error: BaseException, outcome: str) -> None:
    reason = redact_text(str(error), "")
    reason = reason if len(reason) <= 200 else reason[:199] + "…"
    _logger().warning(
        "%s: a metric is not what the report reads (%s: %s); %s", where, type(error).__name__, reason, outcome
    )


def cell(format_metrics: Callable[[dict], str], metrics: dict, where: str) -> str:
    """``format_metrics(metrics)``: one cell of a report, from a stage's ``headline`` or one of its ``columns``;
    ``–`` when a metric is of another type than it reads (it raises :data:`BAD_VALUE`), with one warning naming
    ``where`` (the stage, version and column), so the other cells and reports are still made."""
    try:
        return format_metrics(metrics)
    except BAD_VALUE as e:
        _bad_value(where, e, "that cell shows –")
        return "–"


def headline(stage: str, metrics: dict, version: str = "") -> str:
    """The stage's one number for the run summary (``Stage.headline``) as a :func:`cell`; empty for a stage
    without one."""
    found = BY_NAME[stage].headline
    return cell(found, metrics, f"{stage}/{version} headline") if found else ""


def chart(stage: Stage, versions: list) -> str:
    """``stage.chart(versions)`` (empty for a stage without one); when a version's metrics are of another type
    than the chart reads (it raises :data:`BAD_VALUE`), the chart of the versions it can draw each on its own, a
    warning naming each version left out."""
    if stage.chart is None:
        return ""
    try:
        return stage.chart(versions)
    except BAD_VALUE:
        pass
    drawable = []
    for v in versions:
        try:
            stage.chart([v])
        except BAD_VALUE as e:
            _bad_value(f"{stage.name}/{v.version} chart", e, "that version is left out of the chart")
        else:
            drawable.append(v)
    try:
        return stage.chart(drawable) if drawable else ""
    except BAD_VALUE as e:  # each drawable alone, not together: no chart rather than no comparison
        _bad_value(f"{stage.name} chart", e, "the comparison has no chart")
        return ""


def shown_root(root: str | Path) -> str:
    """An artifact root as the reports name it: an ``s3://`` URL without user info or query (what a URL may carry
    credentials in), a directory as it is."""
    root = str(root)
    return redact_url(root) if "://" in root else root


def comparison_key(stage: str, root: str | Path) -> str:
    """``wiki-<stage>-comparison-<root>``: one comparison history per artifact root (runs on another root compare
    other versions), the root as a slug of its last part and 8 hex digits of its sha256 (what a Prefect key may
    hold: lowercase letters, digits and dashes)."""
    tail = re.sub(r"[^a-z0-9]+", "-", shown_root(root).rstrip("/").rsplit("/", 1)[-1].lower()).strip("-")[:24]
    tail = tail.strip("-")  # cut at 24 characters, it may end in a dash
    digest = hashlib.sha256(str(root).encode("utf-8")).hexdigest()[:8]
    return f"wiki-{stage}-comparison-{tail + '-' if tail else ''}{digest}"


def artifact_links(keys_versions: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """{(stage, version): UI path of the newest artifact describing that version}, for the versions this Prefect
    server has one for; read newest first, a server page at a time, until all are found or none is left."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    wanted = {f"built {stage}/{version}": (stage, version) for stage, version in keys_versions}
    keys = sorted({BY_NAME[stage].artifact_key for stage, _ in keys_versions})
    found: dict[tuple[str, str], str] = {}
    with get_client(sync_client=True) as client:
        offset = 0
        while keys and len(found) < len(set(wanted.values())):
            page = client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=keys)),
                sort=ArtifactSort.CREATED_DESC,
                offset=offset,
            )
            if not page:
                break
            for art in page:
                which = wanted.get(art.description or "")
                if which and which not in found:
                    found[which] = f"/artifacts/artifact/{art.id}"
            offset += len(page)
    return found


def _linked(version: str, link: str | None) -> Markdown:
    # the UI shows no code inside a link's text; the link is the server's own artifact page
    return Markdown(f"[{md_text(version)}]({link})") if link else md_code(version)


def one_line(error: BaseException, limit: int = 500) -> str:
    """An error as literal markdown on one line (type and first line, at most ``limit`` characters), any URL's
    credentials and query redacted whatever raised it."""
    text = next((line.strip() for line in str(error).splitlines() if line.strip()), "no reason given")
    text = redact_text(text, "")
    text = f"{type(error).__name__}: {text}"
    return md_text(text if len(text) <= limit else text[: limit - 1] + "…")


def run_summary(
    root: str | Path | None,
    outcomes: list[Outcome],
    links: dict[tuple[str, str], str],
    failure: BaseException | None,
    warnings: Sequence[str] = (),
) -> str:
    counts = {v: sum(o.verdict == v for o in outcomes) for v in ("built", "Cached")}
    title = f"{counts['built']} built, {counts['Cached']} Cached"
    rows = []
    store = open_store(root) if root is not None else None
    for o in outcomes:
        if o.version and store is not None:
            info = store.get(o.stage, o.version)
            size, metric = human_bytes(info.size_bytes), headline(o.stage, info.manifest.get("metrics", {}), o.version)
        else:
            size, metric = "–", (one_line(failure) if failure is not None else "")
        shown = Markdown("Cached") if o.verdict == "Cached" else Markdown(f"**{md_text(o.verdict)}**")
        version = _linked(o.version, links.get((o.stage, o.version))) if o.version else "–"
        rows.append(md_row(o.stage, shown, version, f"{o.seconds:.1f} s", size, metric))
    lines = [f"# wiki-pipeline run: {title}", ""]
    if failure is not None:
        if root is None:
            where = "before any stage: its settings were refused"
        elif not outcomes:
            where = "before any stage ran"
        elif not outcomes[-1].version:
            where = f"in stage {outcomes[-1].stage}"
        else:
            where = f"after stage {outcomes[-1].stage}"
        lines = [f"# wiki-pipeline run failed: {title}", "", f"**Failed {where}**: {one_line(failure)}", ""]
    lines += [f"**Warning**: {md_text(w)}\n" for w in warnings]
    if store is not None and rows:
        lines += [
            "Built: made by this run. Cached: the same version (settings, inputs, code) was already in the "
            f"artifact store under {md_code(shown_root(store.root))}, so it was reused.",
            "",
        ]
    if rows:
        lines += ["| stage | | version | took | size | headline |", "|---|---|---|---:|---:|---|", *rows, ""]
    return "\n".join(lines)


def differing_settings(versions: list[VersionInfo]) -> list[str]:
    """The setting names whose values are not the same in every version (in the settings' own order)."""
    return _differing([v.manifest.get("settings", {}) for v in versions])


def differing_inputs(versions: list[VersionInfo]) -> list[str]:
    """The input stages whose versions are not the same in every version (same settings, other data)."""
    return _differing(
        [{k: (i or {}).get("version") for k, i in v.manifest.get("inputs", {}).items()} for v in versions]
    )


def _differing(rows: list[dict]) -> list[str]:
    names: list[str] = []
    for row in rows:
        names += [k for k in row if k not in names]
    return [k for k in names if len(rows) > 1 and len({repr(row.get(k)) for row in rows}) > 1]


def compared_stages() -> list[Stage]:
    """The stages with a comparison: those that declare columns of their own."""
    return [s for s in STAGES if s.columns and s.columns_for is None]


def joined_columns(store: ArtifactStore | None, stage: str) -> list[tuple[Column, dict[str, dict]]]:
    """The columns other stages add to ``stage``'s comparison (``Stage.columns_for``), each with the metrics of
    the latest version of that stage built from each ``stage`` version: {``stage`` version: metrics}."""
    joined: list[tuple[Column, dict[str, dict]]] = []
    for other in STAGES:
        if other.columns_for != stage or store is None:
            continue
        by_input: dict[str, dict] = {
            (v.manifest.get("inputs", {}).get(stage) or {}).get("version", ""): v.manifest.get("metrics", {})
            for v in store.versions(other.name)  # oldest first: the latest wins
        }
        joined += [(column, by_input) for column in other.columns]
    return joined


def described(stage: str, manifest: dict | None) -> str:
    """A version in a few words, where its stage has words for it (the tokenizer: "chapter 1024 merges",
    "pretrained gpt2/tokenizer.json"); empty otherwise. Why words: a comparison across tokenizers is read by what
    the tokenizer was, which its version id does not say."""
    if manifest is None or stage != "tokenizer":
        return ""
    settings, metrics = manifest.get("settings", {}), manifest.get("metrics", {})
    kind = settings.get("kind", "chapter")
    merges = metrics.get("num_merges", settings.get("num_merges"))
    if kind == "pretrained":
        source = redact_url(str(metrics.get("source") or settings.get("source") or ""))
        tail = "/".join(source.split("?")[0].rstrip("/").split("/")[-2:])
        return f"pretrained {tail}" + (f" ({merges:,} merges)" if isinstance(merges, int) else "")
    name = "chapter" if kind == "chapter" else f"byte-level ({settings.get('pattern', 'gpt2')} split)"
    return f"{name} {merges:,} merges" if isinstance(merges, int) else name


def _value(value: object) -> str:
    text = str(value)
    return text if len(text) <= 40 else text[:39] + "…"


def changes(older: VersionInfo, newer: VersionInfo, lookup: Lookup | None) -> list[str]:
    """What ``newer`` changed from ``older``, in words: each setting ("steps 40 → 80"), then each input built
    otherwise ("tokenizer: chapter 1024 merges → pretrained gpt2/tokenizer.json", its settings where it has no
    words; an input rebuilt only because another one changed is left out)."""
    said = [
        f"{k} {_value(a)} → {_value(b)}"
        for k in differing_settings([older, newer])
        for a, b in [(older.manifest.get("settings", {}).get(k), newer.manifest.get("settings", {}).get(k))]
    ]
    rebuilt = []
    old_in, new_in = older.manifest.get("inputs", {}), newer.manifest.get("inputs", {})
    for name in differing_inputs([older, newer]):
        a, b = ((old_in.get(name) or {}).get("version"), (new_in.get(name) or {}).get("version"))
        ma = lookup(name, a) if lookup and a else None
        mb = lookup(name, b) if lookup and b else None
        wa, wb = described(name, ma), described(name, mb)
        if wa and wb and wa != wb:
            said.append(f"{name}: {wa} → {wb}")
            continue
        if ma is not None and mb is not None:
            inner = [
                f"{k} {_value(ma.get('settings', {}).get(k))} → {_value(mb.get('settings', {}).get(k))}"
                for k in _differing([ma.get("settings", {}), mb.get("settings", {})])
            ]
            if inner:
                said.append(f"{name}: " + ", ".join(inner))
                continue
        rebuilt.append(name)
    if rebuilt and not said:
        said.append(", ".join(rebuilt) + " rebuilt (same settings)")
    return said


def _comparison_table(
    versions: list[VersionInfo],
    columns: tuple[Column, ...],
    links: dict[tuple[str, str], str],
    joined: list[tuple[Column, dict[str, dict]]] = (),  # type: ignore[assignment]
    lookup: Lookup | None = None,
) -> str:
    """The versions' metrics, one row each (newest first), then what each changed, one line each: the words sit
    below the table, not in a column of it, so the table stays readable at a laptop's width (1,366 px, where the
    UI's page leaves the table about 800)."""
    head = ["version", *(name for name, _ in columns), *(name for (name, _), _ in joined)]
    lines = [md_row(*head), "|" + "---|" * len(head)]
    newest_first = list(reversed(versions))
    said_lines = []
    for i, v in enumerate(newest_first):
        m = v.manifest.get("metrics", {})
        linked = _linked(v.version, links.get((v.stage, v.version)))
        cells = [
            linked,
            *(cell(value, m, f"{v.stage}/{v.version} column {name!r}") for name, value in columns),
            *(
                cell(value, by[v.version], f"{v.stage}/{v.version} column {name!r}") if v.version in by else "–"
                for (name, value), by in joined
            ),
        ]
        lines.append(md_row(*cells))
        below = newest_first[i + 1] if i + 1 < len(newest_first) else None
        said = changes(below, v, lookup) if below is not None else []
        built = str(v.manifest.get("created_at") or "").replace("T", " ").removesuffix("Z")
        words = "; ".join(said) if said else ("the first" if below is None else "nothing (rebuilt)")
        said_lines.append(f"- {linked} (built {md_text(built)}): {md_text(words)}")
    return "\n".join([*lines, "", *said_lines])


def comparison(
    stage: Stage,
    versions: list[VersionInfo],
    links: dict[tuple[str, str], str],
    joined: list[tuple[Column, dict[str, dict]]] = (),  # type: ignore[assignment]
    root: str | Path | None = None,
    lookup: Lookup | None = None,
) -> str:
    """Every version of ``stage`` under ``root`` side by side: its chart (``Stage.chart``), then the table, which
    says what each version changed in words (``lookup`` reads the input versions it names)."""
    drawn = chart(stage, versions)
    where = f"Every published version under the artifact root {md_code(shown_root(root))}. " if root else ""
    return (
        f"# {stage.name.capitalize()} versions compared ({len(versions)})\n\n{drawn}"
        + where
        + HOW_TO_READ
        + _comparison_table(versions, stage.columns, links, joined, lookup)
        + "\n"
    )


def publish(
    root: str | Path | None,
    outcomes: list[Outcome],
    failure: BaseException | None = None,
    warnings: Sequence[str] = (),
) -> None:
    """Post the run summary and the comparisons (inside a flow run). ``failure``: why the run stopped, when it
    did; ``root`` is None when the settings were refused (there is no store to compare); ``warnings``: about the
    settings (``Settings.warnings``), listed under the title."""
    from prefect.artifacts import create_markdown_artifact

    store = open_store(root) if root is not None else None
    compared = {s.name: store.versions(s.name) for s in compared_stages()} if store is not None else {}
    try:
        links = artifact_links(
            [(o.stage, o.version) for o in outcomes if o.version]
            + [(v.stage, v.version) for versions in compared.values() for v in versions]
        )
    except Exception as e:  # the reports without links rather than none
        from prefect import get_run_logger

        get_run_logger().warning("the reports link no artifacts: reading them failed: %s: %s", type(e).__name__, e)
        links = {}
    verdicts = ", ".join(f"{o.stage} {o.verdict}" for o in outcomes)
    built = sum(o.verdict == "built" for o in outcomes)
    cached = sum(o.verdict == "Cached" for o in outcomes)
    description = f"{built} built, {cached} Cached: {verdicts}" if outcomes else "no stage ran"
    create_markdown_artifact(
        key=SUMMARY_KEY,
        markdown=run_summary(root, outcomes, links, failure, warnings),
        description=("Failed: " if failure is not None else "") + description,
    )
    for name, versions in compared.items():
        if versions and store is not None:
            create_markdown_artifact(
                key=comparison_key(name, store.root),
                markdown=comparison(
                    BY_NAME[name], versions, links, joined_columns(store, name), store.root, store.read_manifest
                ),
                description=f"{len(versions)} {name} version(s) side by side",
            )
