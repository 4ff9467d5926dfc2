"""The tokenizer stage's ``kind=pretrained``: an existing byte-level BPE ``tokenizer.json`` taken instead of training.

``tokenizer.source`` names it: an absolute path, a ``file://`` URL or an ``http(s)://`` URL, allowed by the same
lists as the corpus's source (:mod:`flows.allowed`). The version names the file's content (its sha256, through
``Stage.source``), never the address, so new bytes at the same address make a new version. The file is read as
``mygpt tokenizer encode`` reads any byte-level BPE (:func:`mygpt.tokenizers.byte_bpe_files.layout_parts`) and
becomes a ``ByteBPETokenizer``: the same tokens and merges, ids laid out as mygpt lays them out (the 256 bytes in
order, the merges, the specials). Why renumber: every later stage (shards, model, export, evaluate) speaks that
layout, and a model trained here learns its own embedding for each id, so only the tokens must be the file's.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

from mygpt.errors import UserError
from mygpt.regular_files import open_regular
from mygpt.tokenizers.byte_bpe import DEFAULT_SPECIALS, ByteBPETokenizer
from tasks.core.stage import Stage
from tasks.core.urls import address_sha256, check_url, file_path, redact_text, redact_url
from tasks.sources.allowed import RedirectRefused
from tasks.sources.download import DeadlinePassed, SourceMissing, SourceUnreachable, TooBig, probe
from tasks.sources.downloads_gc import untouched_files
from tasks.sources.fallback import FALLBACK_PROBE_ATTEMPTS, last_served_version
from tasks.sources.fetched import stage_knobs, stage_sources
from tasks.store import ArtifactStore

#: How many of a tokenizer's first merges its stats.json and report show.
FIRST_MERGES = 30
#: The most a tokenizer.json may hold (the largest public ones, with 200k merges, are ~10 MB).
MAX_TOKENIZER_BYTES = 256 << 20
#: The most a tokenizer.json's download may take, its retries included (lower with
#: ``WIKI_PIPELINE_DOWNLOAD_DEADLINE``): GPT-2's 1.4 MB comes in seconds, and a source that drips holds the stage's
#: build lock while it waits.
TOKENIZER_DEADLINE = 600.0
EOS = DEFAULT_SPECIALS[0]
FIELD = "tokenizer.source"
#: BPE model options a file may set only to these values: anything else changes which tokens come out.
_PLAIN_BPE = {"dropout": None, "continuing_subword_prefix": None, "end_of_word_suffix": None, "ignore_merges": False}


def check_source(value: str) -> str:
    """``value`` (stripped) if it is an absolute path or an ``http(s)://`` / ``file://`` URL; else ``ValueError``
    naming what to give."""
    value = value.strip()
    shown = redact_url(value)
    if "://" not in value:
        if not os.path.isabs(os.path.expanduser(value)):
            raise ValueError(
                f"source {shown!r} is not an absolute path or a URL; give /absolute/path/tokenizer.json, "
                "file:///absolute/path/tokenizer.json or an http(s):// URL"
            )
        return value
    return check_url(value, "source")


def source_url(source: str) -> str:
    """``source`` as a URL: a path becomes its ``file://`` URL (what the allow-lists compare)."""
    if "://" in source:
        return source
    return Path(os.path.expanduser(source)).as_uri()


def read_source(source: str, staging: Path, log=None) -> bytes:
    """The bytes at ``source`` (at most :data:`MAX_TOKENIZER_BYTES`); ``UserError`` naming ``tokenizer.source``
    (redacted) and what to do for a missing file, one that is not a regular file (a FIFO, a device), or an
    unreachable, refusing or too slow server (:data:`TOKENIZER_DEADLINE`). An http(s) source is downloaded into
    ``staging`` (a folder of the artifact store: a stopped download resumes there, gc collects what is left), and
    the copy deleted once read."""
    url = source_url(source)
    shown = redact_url(url)
    if url.lower().startswith("file:"):
        path = file_path(url)
        if not path.is_file():  # stat only: a FIFO is never opened (reading one would wait for a writer)
            if path.is_dir():
                what = "is a directory"
            elif path.exists():
                what = "is not a regular file (a device, a pipe or a socket)"
            else:
                what = "does not exist"
            raise UserError(
                f"tokenizer.source {shown}: {path} {what}; give the path of a byte-level BPE tokenizer.json "
                f"(mygpt tokenizer train --out DIR makes DIR/tokenizer.json)"
            )
        with open_regular(path, "tokenizer.source", "give the path of a byte-level BPE tokenizer.json") as f:
            content = f.read(MAX_TOKENIZER_BYTES + 1)  # what is read is capped: procfs says size 0, a file grows
        if len(content) > MAX_TOKENIZER_BYTES:
            raise _too_big(shown)
        return content
    from tasks.sources.download import fetch

    staging.mkdir(parents=True, exist_ok=True)
    dest = staging / download_name(url)
    knobs = stage_knobs()
    deadline = min(knobs.deadline, TOKENIZER_DEADLINE)
    try:
        with open(dest.with_name(dest.name + ".lock"), "a") as lock:  # two runs of one address: one at a time
            fcntl.flock(lock, fcntl.LOCK_EX)
            fetch(url, dest, knobs=knobs, max_bytes=MAX_TOKENIZER_BYTES, log=log, field=FIELD, deadline=deadline)
            return dest.read_bytes()
    except RedirectRefused:
        raise
    except TooBig:
        dest.with_name(dest.name + ".json").unlink(missing_ok=True)  # what the server said of a body not kept
        raise _too_big(shown) from None
    except DeadlinePassed as e:
        raise UserError(
            f"tokenizer.source {shown} did not arrive within {deadline:g} seconds, the most a tokenizer.json's "
            f"download may take ({e.have:,} bytes came: the server sends too slowly, or a byte now and then); check "
            f"the source or the network, or give a local copy's path; a rerun resumes from the bytes that came"
        ) from None
    except UserError as e:
        raise UserError(f"tokenizer.source: {_told(e, url)}") from None
    finally:
        dest.unlink(missing_ok=True)


def download_name(url: str) -> str:
    """The file a download of ``url`` is staged as (named by the address's sha256: no secret in a file name)."""
    return f"{address_sha256(url)[:32]}.tokenizer.json"


def staging_dir(store: ArtifactStore, stage: Stage) -> Path:
    """Where the tokenizer stage stages its downloads before a build: ``<root>/tokenizer/.sources/downloads/``."""
    return stage_sources(store, stage.name).dir / "downloads"


_DOWNLOAD_RE = re.compile(r"[0-9a-f]{32}\.tokenizer\.json(?:\.part|\.json|\.lock)?")
#: A staged download untouched this long is no running download's (its reads touch it far more often).
UNTOUCHED_SECONDS = 2 * TOKENIZER_DEADLINE


def stopped_downloads(stage_dir: Path) -> Iterator[tuple[Path, int, str]]:
    """gc's leftovers of the tokenizer stage (``stage_dir``): each file of a download a stopped run left in
    :func:`staging_dir`, untouched for :data:`UNTOUCHED_SECONDS` (a rerun of that source would resume it; a run
    deletes its copy once read)."""
    why = "a tokenizer.source download a stopped run left (a rerun would resume it)"
    return untouched_files(stage_dir / ".sources" / "downloads", _DOWNLOAD_RE, UNTOUCHED_SECONDS, why)


def _told(e: UserError, url: str) -> str:
    """A download error's message as this field's: redacted, naming ``tokenizer.source`` (not ``source_url``)."""
    return redact_text(str(e), url).replace("source_url", "tokenizer.source")


def _too_big(shown: str) -> UserError:
    return UserError(
        f"tokenizer.source {shown} holds more than {MAX_TOKENIZER_BYTES:,} bytes, more than any tokenizer.json; "
        "check that it names a tokenizer.json"
    )


def identity(content: bytes) -> dict:
    """What a version names of a tokenizer file: its sha256 and size."""
    return {"sha256": hashlib.sha256(content).hexdigest(), "bytes": len(content)}


def tokenizer_from_file(path: Path, shown: str) -> tuple[ByteBPETokenizer, bool]:
    """``(tokenizer, renumbered)``: the byte-level BPE in the ``tokenizer.json`` at ``path`` as a
    ``ByteBPETokenizer`` (``renumbered``: its ids differ from the file's, its tokens do not); ``UserError`` naming
    ``shown`` for a file that is not one, splits otherwise than by GPT-2's or GPT-4's pattern, or has no
    ``<|endoftext|>``."""
    import json

    from mygpt.tokenizers.byte_bpe_files import layout_parts, vocab_strings

    def refuse(what: str) -> UserError:
        return UserError(f"tokenizer.source {shown} {what}")

    try:
        merges, specials, pattern, vocab = layout_parts(path)
    except UserError as e:
        message = str(e).replace(f"tokenizer file {path} ", "").replace(str(path), shown)
        raise refuse(message) from None
    whole = json.loads(path.read_text(encoding="utf-8"))
    model = whole["model"]
    _check_extras(whole, refuse)
    odd = [f"{k}={model[k]!r}" for k, plain in _PLAIN_BPE.items() if model.get(k, plain) not in (plain, "")]
    if pattern is None or odd:
        raise refuse(
            "is a byte-level BPE that does more than split by GPT-2's or GPT-4's pattern and merge"
            + (
                f" (its BPE model sets {', '.join(odd)})"
                if odd
                else " (a normalizer, a prefix space, another split pattern, or added tokens that are not special)"
            )
            + "; the pipeline's shards, export and tiktoken file need one of those two patterns: train one with "
            "mygpt tokenizer train, or use tokenizer.kind=byte"
        )
    if EOS not in specials:
        raise refuse(
            f"has no {EOS} special token (its specials: {sorted(specials) or 'none'}), which the shards put after "
            f"each article and the export names as the end of text; add it to the file's added_tokens as a special "
            f"token, or train one with mygpt tokenizer train (which adds it)"
        )
    for special in specials:
        why = _ordinary_text(special, vocab)
        if why:
            raise refuse(_special_refused(special, why))
    try:
        tok = ByteBPETokenizer(
            merges=tuple(merges), specials=tuple(sorted(specials, key=specials.__getitem__)), pattern=pattern
        )
        ours = vocab_strings(tok)
    except UserError as e:
        raise refuse(f"cannot be used as it is: {e}") from None
    missing, extra = set(ours) - set(vocab), set(vocab) - set(ours)
    if missing or extra:
        raise refuse(
            f"has a vocabulary that is not its 256 bytes and the tokens its merges make ({len(missing)} of those "
            f"missing, {len(extra)} tokens no merge makes, e.g. {sorted(missing or extra)[0]!r}); give a byte-level "
            "BPE whose vocabulary is exactly that (GPT-2's is; mygpt tokenizer train writes one)"
        )
    return tok, ours != vocab or tok.special_ids != specials


def _ordinary_text(special: str, vocab: dict) -> str | None:
    """Why ordinary text contains ``special`` (None: no sign of it): an ordinary token of ``vocab`` spells it, or
    it is made of letters, digits and spaces only, as words are."""
    from mygpt.tokenizers.byte_bpe_files import token_string

    if token_string(special.encode("utf-8")) in vocab:
        return "an ordinary token of the vocabulary spells it"
    if all(c.isalnum() or c.isspace() or c == "_" for c in special):
        return "it is made of letters, digits and spaces only, as ordinary words are"
    return None


def _special_refused(special: str, why: str) -> str:
    """Why a special that ordinary text contains cannot be taken. Why refused: Hugging Face's tokenizer (the
    export's) takes a special out of any text that contains it, even inside a word, while the shards encode a
    document's text as ordinary bytes, so the export would tokenize the training text otherwise than the model saw
    it."""
    return (
        f"has the special token {special!r}, which ordinary text contains ({why}): Hugging Face's tokenizer, as "
        f"the export uses it, takes it out of any text that holds it, even inside a longer word, while the shards "
        f"encode text as ordinary bytes, so the export would disagree with the training data; remove it from the "
        f"file's added_tokens or give it a name no text contains (like <|{special}|>)"
    )


def check_specials_absent(specials: tuple[str, ...], splits: dict[str, Path], tokenizer: Path, version: str) -> None:
    """``UserError`` when the text of a split (``{split: path}``, every file the shards encode) holds one of the
    ``specials`` of the byte-level tokenizer ``version`` (its files at ``tokenizer``), naming the special, the split
    and how often (and a pretrained kind's source). Why every split, not the tokenizer's slice: a special first
    seen past the slice (``( S`` is in wiki.train.txt, not in the tiny preset's 200 KB) would be cut out as one id
    by the export's tokenizer where the shards hold its bytes."""
    import json
    import mmap

    try:
        stats = json.loads((tokenizer / "stats.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        stats = {}
    named = f"tokenizer/{version}"
    if stats.get("kind") == "pretrained" and stats.get("source"):
        named = f"tokenizer.source {stats['source']} ({named})"

    for split, path in splits.items():
        if path.stat().st_size == 0:
            continue
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as text:
            for special in specials:
                needle = special.encode("utf-8")
                at, count = text.find(needle), 0
                first = at
                while at >= 0 and count < 1000:
                    count += 1
                    at = text.find(needle, at + 1)
                if count:
                    times = f"{count:,} times" if count < 1000 else "1,000 times or more"
                    raise UserError(
                        f"{named} "
                        + _special_refused(
                            special,
                            f"the corpus's {split} split, {path.name}, holds it {times}, first at byte {first:,}",
                        )
                    )


def _check_extras(whole: dict, refuse) -> None:
    """Refuse a file whose post-processor adds tokens or that sets truncation or padding. Why refuse, not warn:
    the stage keeps only the tokens and merges, so those settings would be dropped from the export silently and
    its ids (add_special_tokens, fixed lengths) would differ from what the file's own users get."""
    if whole.get("truncation") is not None or whole.get("padding") is not None:
        what = " and ".join(k for k in ("truncation", "padding") if whole.get(k) is not None)
        raise refuse(
            f"sets {what}, which the pipeline's tokenizer (and so its export) does not keep; remove it from the "
            "file (set it to null): truncation and padding belong to whoever calls the tokenizer"
        )
    post = whole.get("post_processor")
    steps = post.get("processors", []) if isinstance(post, dict) and post.get("type") == "Sequence" else [post]
    for step in steps:
        kind = step.get("type") if isinstance(step, dict) else None
        adds = isinstance(step, dict) and kind == "TemplateProcessing" and bool(step.get("special_tokens"))
        if step is not None and (kind not in ("ByteLevel", "TemplateProcessing") or adds):
            raise refuse(
                f"has a {kind} post_processor, which adds tokens around each text the pipeline's tokenizer (and so "
                "its export) would not add; remove the post_processor (set it to null), or keep only a ByteLevel "
                "one (GPT-2's, which changes offsets only)"
            )


def pretrained_source(settings, store: ArtifactStore | None, log, stage: Stage) -> dict | None:
    """``Stage.source`` of the tokenizer stage (``stage``): for ``kind=pretrained`` the identity of the file at
    ``settings.source`` (read now: a tokenizer.json is small), else None (the trained kinds read only the store).

    An http(s) source that cannot be reached (network, 5xx, 401/403; a 404 is an answer and fails) names what it
    served last as far as ``store`` knows, with a warning, as the corpus's zip does (docs/CORPUS.md, the offline
    fallback): a finished pipeline reruns offline. Why ask with a probe first: it tells an unreachable server from
    one that answered (the download's errors do not), in two tries, not a download's back-off. Each file read is
    noted as served by its address (the fallback ranks by it); ``store`` None (a lineage check that knows no root):
    no fallback, and a download staged in a folder of its own, deleted after."""
    if settings.kind != "pretrained":
        return None
    url = source_url(settings.source)
    if url.lower().startswith("file:") or store is None:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="wiki-tokenizer-") as own:
            return identity(read_source(settings.source, staging_dir(store, stage) if store else Path(own), log))
    address = address_sha256(url)
    fallback = last_served_version(store, stage, address)
    if fallback is not None:  # something to fall back to: ask twice whether the server answers
        knobs = stage_knobs()
        try:
            probe(url, dataclasses.replace(knobs, attempts=min(knobs.attempts, FALLBACK_PROBE_ATTEMPTS)), log, FIELD)
        except SourceUnreachable as e:
            found = fallback.manifest["source"]
            log.warning(
                "tokenizer: cannot check tokenizer.source %s now (%s); taking it to hold what it served last as far "
                "as this artifact root knows, sha256 %s (tokenizer/%s, published %s): the file there may have "
                "changed since",
                redact_url(url),
                _told(e, url),
                found.get("sha256"),
                fallback.version,
                fallback.manifest.get("created_at"),
            )
            return found
        except SourceMissing as e:
            raise UserError(f"tokenizer.source: {_told(e, url)}") from None
    got = identity(read_source(settings.source, staging_dir(store, stage), log))
    stage_sources(store, stage.name).mark_served(address, got["sha256"])
    return got


def build_pretrained(ctx, settings, train_path: Path, used: int) -> dict:
    """Read the file the version names (refused when its bytes changed since the version was named), check it,
    write it as the stage's ``tokenizer.json`` (mygpt's layout) and ``stats.json`` with its tokens per character
    on the corpus slice."""
    shown = redact_url(source_url(settings.source))
    content = read_source(settings.source, ctx.work / "download", ctx.log)
    got = identity(content)
    if ctx.source and got["sha256"] != ctx.source.get("sha256"):
        raise UserError(
            f"tokenizer.source {shown} now holds other bytes (sha256 {got['sha256']}) than the ones this run's "
            f"version names ({ctx.source.get('sha256')}): the file changed while this run was using it; rerun"
        )
    copy = ctx.work / "source.tokenizer.json"
    copy.write_bytes(content)
    tok, renumbered = tokenizer_from_file(copy, shown)
    copy.unlink()
    ctx.log.info("tokenizer: %s is a byte-level BPE of %d merges (%s split)", shown, len(tok.merges), tok.pattern)
    ctx.progress(1, 2, "counting the slice's tokens", force=True)
    with open(train_path, "rb") as f:
        text = f.read(used).decode("utf-8", errors="replace")
    for special in tok.specials:
        if special in text:
            raise UserError(
                f"tokenizer.source {shown} "
                + _special_refused(special, f"the corpus slice holds it {text.count(special):,} times")
            )
    head = {
        "kind": "pretrained",
        "source": shown,
        "source_sha256": got["sha256"],
        "source_url_sha256": address_sha256(source_url(settings.source)),  # the address the offline fallback matches
        "source_bytes": got["bytes"],
        "renumbered": renumbered,
    }
    return write_byte_level(ctx, tok, text, used, head, train_seconds=0.0)


def write_byte_level(ctx, tok: ByteBPETokenizer, text: str, used: int, head: dict, train_seconds: float) -> dict:
    """Write a byte-level tokenizer (trained or pretrained) as the stage's ``tokenizer.json`` and ``stats.json``:
    ``head`` (what only its kind knows), then what both kinds report of it over the slice ``text`` (``used``
    bytes) -- one home, so the report reads the same fields whichever kind made it. Returns the stats."""

    from mygpt.tokenizers.files import save_tokenizer_file

    t0 = time.monotonic()
    tokens = len(tok.encode_array(text))
    save_tokenizer_file(tok, ctx.out / "tokenizer.json")
    stats = {
        **head,
        "pattern": tok.pattern,
        "vocab_size": tok.vocab_size,
        "alphabet_size": 256,
        "num_merges": len(tok.merges),
        "specials": list(tok.specials),
        "first_merges": [
            [a.decode("utf-8", "backslashreplace"), b.decode("utf-8", "backslashreplace")]
            for a, b in tok.merges[:FIRST_MERGES]
        ],
        "train_bytes": used,
        "train_chars": len(text),
        "train_tokens": tokens,
        "chars_per_token": round(len(text) / tokens, 4) if tokens else None,
        "bytes_per_token": round(used / tokens, 4) if tokens else None,
        "encode_seconds": round(time.monotonic() - t0, 3),
        "train_seconds": round(train_seconds, 3),
    }
    write_stats(ctx.out, stats)
    ctx.progress(2, 2, "done", force=True)
    return stats


def write_stats(out: Path, stats: dict) -> None:
    """The tokenizer's ``stats.json``: ``stats`` less its timings (``*_seconds``, the metrics keep them). Why: a
    version's files are what it is, and downstream versions name it by their digest; a timing in them would give
    equal tokenizers different digests."""
    import json

    from mygpt.atomic import atomic_write_text

    kept = {k: v for k, v in stats.items() if not k.endswith("_seconds")}
    atomic_write_text(out / "stats.json", json.dumps(kept, indent=1, ensure_ascii=False) + "\n")
