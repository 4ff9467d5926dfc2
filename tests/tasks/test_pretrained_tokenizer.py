"""``tokenizer.kind=pretrained``: a tokenizer.json made by ``mygpt tokenizer train`` on real text, served by a real
HTTP server on 127.0.0.1, taken by the tiny pipeline instead of training (every stage outside Prefect); versioned
by the file's sha256; a GPT-2-layout file (bytes not in id order) taken with the same tokens; and the bad inputs,
each one clear error."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flows.allowed import ENV_SOURCES
from flows.settings import TINY, Pipeline
from mygpt.errors import UserError
from tasks.core import shard_format as SF
from tasks.tokenizer import load_tokenizer, train_tokenizer
from tests.support import REPO
from tests.support.http_servers import dir_server
from tests.support.stages import every_stage
from tests.support.tiny import run_in, tiny_zip_url

EOT = "<|endoftext|>"
MERGES = 60


def mygpt_train(text: Path, out: Path, *extra: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mygpt.cli", "tokenizer", "train", str(text), "--vocab-size", str(256 + MERGES + 1)]
        + [*extra, "--out", str(out)],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def served(tmp_path_factory, shakespeare_text):
    """A directory of tokenizer files and a real HTTP server on 127.0.0.1 serving it."""
    d = tmp_path_factory.mktemp("served")
    (d / "train.txt").write_text(shakespeare_text[:80_000], encoding="utf-8")
    mygpt_train(d / "train.txt", d / "tok")
    with dir_server(d) as server:
        yield d, server


def settings(tmp: Path, **tokenizer):
    return Pipeline.parse(
        **{**TINY, "corpus": {"source_url": tiny_zip_url(tmp)}, "tokenizer": {**TINY["tokenizer"], **tokenizer}}
    )


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, served):
    _, server = served
    tmp = tmp_path_factory.mktemp("pretrained-pipeline")
    s = settings(tmp, kind="pretrained", source=server.url("tok/tokenizer.json"))
    run = run_in(tmp / "art")
    refs = every_stage(s, run)
    return s, run, refs


def train_tokenizer_report(info: dict) -> str:
    from tasks.tokenizer import STAGE

    return STAGE.report(info)


def manifest(ref) -> dict:
    return json.loads((Path(ref["path"]) / "manifest.json").read_text(encoding="utf-8"))


def test_the_pipeline_runs_on_the_served_tokenizer_json(pipeline, served, wikitext2_text):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    d, _ = served
    _, _, refs = pipeline
    original = d / "tok" / "tokenizer.json"
    info = manifest(refs["tokenizer"])
    assert info["source"]["sha256"] == hashlib.sha256(original.read_bytes()).hexdigest()
    assert info["metrics"]["renumbered"] is False and info["metrics"]["num_merges"] == MERGES
    assert info["settings"] == {"kind": "pretrained", "bpe_train_bytes": TINY["tokenizer"]["bpe_train_bytes"]}
    md = train_tokenizer_report(info)
    assert "pretrained byte-level BPE, gpt2 split, from `http://127.0.0.1:" in md and info["source"]["sha256"] in md
    assert "not trained (pretrained)" in md
    tok = load_tokenizer(refs["tokenizer"]["path"])
    assert tok.kind == "byte" and tok.vocab_size == 256 + MERGES + 1
    text = wikitext2_text[100_000:103_000] + " 東京 🚀 café"
    want = Tokenizer.from_file(str(original)).encode(text, add_special_tokens=False).ids
    assert tok.encode_array(text).tolist() == want
    # shards: <|endoftext|> after each article, as for kind=byte
    assert manifest(refs["corpus"])["settings"]["article_index"] is True
    ids = np.concatenate([SF.read_shard(p) for p in SF.shard_paths(refs["shards"]["path"], "valid")])
    articles = np.load(Path(refs["corpus"]["path"]) / "wiki.valid.articles.npy")
    assert int((ids == tok.special_ids[EOT]).sum()) == len(articles)
    # export and evaluate
    hf_tok = AutoTokenizer.from_pretrained(refs["export"]["path"])
    assert hf_tok(text, add_special_tokens=False)["input_ids"] == want and hf_tok.eos_token == EOT
    assert (Path(refs["export"]["path"]) / "tokenizer.tiktoken").is_file()
    assert manifest(refs["evaluate"])["metrics"]["test_bpb"] > 0
    assert all(s["continuation"] for s in manifest(refs["samples"])["metrics"]["samples"])


def test_the_version_names_the_files_content_not_its_address(pipeline, served, tmp_path):
    d, server = served
    s, run, refs = pipeline
    copy = d / "copy"
    copy.mkdir(exist_ok=True)
    (copy / "tokenizer.json").write_bytes((d / "tok" / "tokenizer.json").read_bytes())
    again = s.resolved("tokenizer").model_copy(update={"source": str(copy / "tokenizer.json")})
    assert train_tokenizer.fn(refs["corpus"], again, run)["version"] == refs["tokenizer"]["version"]
    mygpt_train(d / "train.txt", d / "gpt4", "--pattern", "gpt4")  # other bytes at another address
    other = s.resolved("tokenizer").model_copy(update={"source": server.url("gpt4/tokenizer.json")})
    ref = train_tokenizer.fn(refs["corpus"], other, run)
    assert ref["version"] != refs["tokenizer"]["version"] and load_tokenizer(ref["path"]).pattern == "gpt4"


def test_an_unreachable_source_is_taken_to_hold_what_it_served_last(served, tmp_path, fast_retries, caplog):
    """With its server stopped, a rerun (and ``only=`` naming the source) takes the file the address served last, a
    warning naming the version, instead of failing; a 404 is an answer, not unreachability: it fails; where nothing
    was read from the address, the error names tokenizer.source."""
    import logging
    import re
    import shutil

    from flows.only import asked_of_upstream, latest_upstream
    from tasks.registry import BY_NAME, open_store
    from tests.support import stages

    d, _ = served
    site = tmp_path / "site"
    shutil.copytree(d / "tok", site)
    root = tmp_path / "art"
    corpus = stages.corpus(root, source_url=tiny_zip_url(tmp_path), article_index=True)
    kind = {"kind": "pretrained", "bpe_train_bytes": 20_000}
    with dir_server(site) as server:
        url = server.url("tokenizer.json")
        ref = stages.tokenizer(root, corpus, source=url, **kind)
        (site / "tokenizer.json").rename(site / "moved.json")
        with pytest.raises(UserError, match=r"^tokenizer\.source: downloading .* HTTP 404 .*check tokenizer\.source"):
            stages.tokenizer(root, corpus, source=url, **kind)  # the server answered: nothing stands in
        (site / "moved.json").rename(site / "tokenizer.json")
    shards = stages.shards(root, corpus, ref, shard_tokens=4096, run={"workers": 1})
    with caplog.at_level("WARNING", logger="wiki_pipeline"):  # the server is stopped
        assert stages.tokenizer(root, corpus, source=url, **kind) == ref
    sha = manifest(ref)["source"]["sha256"]
    assert f"cannot check tokenizer.source {url} now" in caplog.text, caplog.text
    assert f"sha256 {sha} (tokenizer/{ref['version']}, published " in caplog.text
    only = Pipeline.parse(tokenizer={"kind": "pretrained", "source": url}, run={"only": "model"})
    store = open_store(root)
    assert latest_upstream(store, "model", asked_of_upstream(only, store))["shards"] == shards
    settings = only.resolved("tokenizer")
    with pytest.raises(UserError, match=r"^tokenizer\.source: downloading " + re.escape(url) + " failed 4 times"):
        BY_NAME["tokenizer"].source(settings, open_store(tmp_path / "elsewhere"), logging.getLogger("wiki_pipeline"))


def gpt2_layout(ours: Path, out: Path) -> Path:
    """``ours`` rewritten with GPT-2's id layout: the 256 byte tokens in GPT-2's order (printable first)."""
    from mygpt.tokenizers.byte_bpe_files import bytes_to_unicode

    data = json.loads(ours.read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    order = list(bytes_to_unicode().values())  # GPT-2's vocab.json order for the bytes
    for i, ch in enumerate(order):
        vocab[ch] = i
    out.write_text(json.dumps(data), encoding="utf-8")
    return out


def test_a_gpt2_layout_file_is_taken_with_the_same_tokens(pipeline, served, wikitext2_text, tmp_path):
    from tokenizers import Tokenizer

    from mygpt.tokenizers.byte_bpe_files import hf_tokenizer

    d, _ = served
    s, run, refs = pipeline
    path = gpt2_layout(d / "tok" / "tokenizer.json", tmp_path / "tokenizer.json")
    ref = train_tokenizer.fn(refs["corpus"], s.resolved("tokenizer").model_copy(update={"source": str(path)}), run)
    assert manifest(ref)["metrics"]["renumbered"] is True
    tok = load_tokenizer(ref["path"])
    text = wikitext2_text[:5_000] + " 東京 🚀"
    theirs = Tokenizer.from_file(str(path)).encode(text, add_special_tokens=False)
    assert theirs.ids != tok.encode_array(text).tolist()  # other ids ...
    assert hf_tokenizer(tok).encode(text, add_special_tokens=False).tokens == theirs.tokens  # ... the same tokens


def bad(s, run, refs, source) -> str:
    with pytest.raises(UserError) as e:
        train_tokenizer.fn(refs["corpus"], s.resolved("tokenizer").model_copy(update={"source": source}), run)
    return str(e.value)


def test_bad_tokenizer_files_are_clear_errors(pipeline, served, tmp_path):
    d, server = served
    s, run, refs = pipeline
    missing = tmp_path / "nowhere" / "tokenizer.json"
    message = bad(s, run, refs, str(missing))
    assert f"tokenizer.source {missing.as_uri()}" in message and "does not exist" in message
    assert "mygpt tokenizer train" in message
    assert "404" in bad(s, run, refs, server.url("tok/absent.json"))
    damaged = d / "damaged.json"
    damaged.write_bytes((d / "tok" / "tokenizer.json").read_bytes()[:500])
    message = bad(s, run, refs, server.url("damaged.json"))
    assert message.startswith(f"tokenizer.source {server.url('damaged.json')} is not a JSON tokenizer.json")
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    Tokenizer(WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(tmp_path / "word.json"))
    assert "is not a BPE tokenizer.json (model type 'WordLevel')" in bad(s, run, refs, str(tmp_path / "word.json"))
    mygpt_train(d / "train.txt", d / "pad", "--special-token", "<|pad|>")
    message = bad(s, run, refs, str(d / "pad" / "tokenizer.json"))
    assert "has no <|endoftext|> special token (its specials: ['<|pad|>'])" in message
    no_split = json.loads((d / "tok" / "tokenizer.json").read_text(encoding="utf-8"))
    no_split["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    (tmp_path / "prefix.json").write_text(json.dumps(no_split), encoding="utf-8")
    assert "does more than split by GPT-2's or GPT-4's pattern" in bad(s, run, refs, str(tmp_path / "prefix.json"))


def with_changes(served_dir: Path, out: Path, special: str | None = None, **top) -> str:
    """The served tokenizer.json with one more special token ``special`` and the top-level keys ``top`` set."""
    data = json.loads((served_dir / "tok" / "tokenizer.json").read_text(encoding="utf-8"))
    if special is not None:
        next_id = max(t["id"] for t in data["added_tokens"]) + 1
        data["added_tokens"].append(
            {
                "id": next_id,
                "content": special,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    data.update(top)
    out.write_text(json.dumps(data), encoding="utf-8")
    return str(out)


def test_a_special_that_ordinary_text_contains_is_refused(pipeline, served, tmp_path):
    """Hugging Face takes a special out of any text that holds it (``the`` even inside ``there``) while the shards
    encode text as ordinary bytes: a special spelled like a word, like an ordinary token, or found in the corpus
    slice is refused, naming it and why; a special no text holds is taken."""
    from tokenizers import Tokenizer

    d, _ = served
    s, run, refs = pipeline
    path = with_changes(d, tmp_path / "the.json", "the")
    hf = Tokenizer.from_file(path)
    assert hf.encode("there").tokens[0] == "the"  # the disagreement itself: HF splits it out of a longer word
    message = bad(s, run, refs, path)
    assert message.startswith(
        f"tokenizer.source {Path(path).as_uri()} has the special token 'the', which ordinary "
        "text contains (it is made of letters, digits and spaces only"
    ), message
    vocab = json.loads((d / "tok" / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    token = " " + next(t for t in vocab if t.startswith("Ġ") and len(t) > 1 and t[1:].isascii())[1:]  # " t"
    message = bad(s, run, refs, with_changes(d, tmp_path / "tok.json", token))
    assert f"has the special token {token!r}, which ordinary text contains (an ordinary token" in message, message
    message = bad(s, run, refs, with_changes(d, tmp_path / "atat.json", " @-@ "))  # wikitext's hyphen
    assert "has the special token ' @-@ ', which ordinary text contains (the corpus slice holds it " in message
    ref = train_tokenizer.fn(
        refs["corpus"],
        s.resolved("tokenizer").model_copy(update={"source": with_changes(d, tmp_path / "ok.json", "<|pad|>")}),
        run,
    )
    assert load_tokenizer(ref["path"]).specials == (EOT, "<|pad|>")


def test_post_processing_truncation_and_padding_are_refused_not_dropped(pipeline, served, tmp_path):
    """Settings the pipeline's tokenizer would not keep are refused, naming them; GPT-2's ByteLevel post-processor
    (offsets only) is taken."""
    d, _ = served
    s, run, refs = pipeline
    template = {
        "type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": EOT, "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
        "special_tokens": {EOT: {"id": EOT, "ids": [256 + MERGES], "tokens": [EOT]}},
    }
    message = bad(s, run, refs, with_changes(d, tmp_path / "post.json", post_processor=template))
    assert "has a TemplateProcessing post_processor, which adds tokens" in message, message
    truncation = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
    message = bad(s, run, refs, with_changes(d, tmp_path / "trunc.json", truncation=truncation))
    assert "sets truncation, which the pipeline's tokenizer (and so its export) does not keep" in message, message
    gpt2_post = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    path = with_changes(d, tmp_path / "gpt2post.json", post_processor=gpt2_post)
    ref = train_tokenizer.fn(refs["corpus"], s.resolved("tokenizer").model_copy(update={"source": path}), run)
    assert ref["version"]


def test_a_source_that_is_not_a_regular_file_or_nests_too_deeply_is_one_clear_error(pipeline, tmp_path):
    """A FIFO (never opened: it would wait for a writer) and a device are not "missing"; JSON nested past the
    parser's recursion is refused as no tokenizer.json, not a RecursionError."""
    s, run, refs = pipeline
    os.mkfifo(tmp_path / "fifo.json")
    for path in (tmp_path / "fifo.json", Path("/dev/zero")):
        message = bad(s, run, refs, str(path))
        assert message.startswith(f"tokenizer.source {path.as_uri()}: {path} is not a regular file"), message
    (tmp_path / "deep.json").write_text("[" * 200_000 + "]" * 200_000, encoding="utf-8")
    message = bad(s, run, refs, str(tmp_path / "deep.json"))
    assert message.startswith(f"tokenizer.source {(tmp_path / 'deep.json').as_uri()} nests its JSON"), message


def test_a_source_outside_the_allowed_ones_is_refused_before_any_stage(monkeypatch, served, tmp_path):
    d, server = served
    monkeypatch.setenv(ENV_SOURCES, f"{server.url('tok/')} file://{tmp_path}/")
    settings(tmp_path, kind="pretrained", source=server.url("tok/tokenizer.json"))  # allowed
    with pytest.raises(UserError, match=r"^tokenizer\.source http://127\.0\.0\.1:\d+/pad/tokenizer\.json is outside"):
        settings(tmp_path, kind="pretrained", source=server.url("pad/tokenizer.json"))
    with pytest.raises(UserError, match=r"^tokenizer\.source file:///.*/tok/tokenizer\.json is outside"):
        settings(tmp_path, kind="pretrained", source=str(d / "tok" / "tokenizer.json"))


@pytest.mark.parametrize(
    ("tokenizer", "message"),
    [
        ({"kind": "pretrained"}, "tokenizer: kind=pretrained needs source"),
        ({"source": "/t/tokenizer.json"}, "source applies only to kind=pretrained"),
        ({"kind": "pretrained", "source": "tok/tokenizer.json"}, "is not an absolute path or a URL"),
        ({"kind": "pretrained", "source": "ftp://h/tokenizer.json"}, "has scheme 'ftp'"),
        ({"kind": "pretrained", "source": "/t.json", "pattern": "gpt4"}, "a pretrained tokenizer.json has its own"),
    ],
)
def test_pretrained_settings_are_checked(tokenizer, message):
    with pytest.raises(UserError, match=message.replace(".", r"\.")):
        Pipeline.parse(tokenizer=tokenizer)


def test_credentials_in_the_source_are_never_shown():
    s = Pipeline.parse(tokenizer={"kind": "pretrained", "source": "https://alice:secret@h.example/tokenizer.json"})
    assert "secret" not in json.dumps(s.resolved("tokenizer").model_dump(mode="json"))
    assert "secret" not in json.dumps(s.resolved("tokenizer").version_params())


def test_a_special_that_only_a_later_split_holds_is_refused_by_the_shards(pipeline, served, tmp_path):
    """The tokenizer stage sees only its slice; ``( S`` is not in it but later in the corpus: the tokenizer is taken,
    and the shards stage, which reads every split, refuses it naming the special and the split, before any shard
    (the export's Hugging Face tokenizer would cut it out as one id where the shards hold its bytes)."""
    SPLIT_FILES = {s: f"wiki.{s}.txt" for s in ("train", "valid", "test")}

    d, _ = served
    s, run, refs = pipeline
    special = "( S"
    settings_ = s.resolved("tokenizer").model_copy(update={"source": with_changes(d, tmp_path / "ps.json", special)})
    tok_ref = train_tokenizer.fn(refs["corpus"], settings_, run)  # not in the slice: taken
    used = json.loads((Path(tok_ref["path"]) / "stats.json").read_text(encoding="utf-8"))["train_bytes"]
    corpus_dir = Path(refs["corpus"]["path"])
    holding = [split for split, name in SPLIT_FILES.items() if special.encode() in (corpus_dir / name).read_bytes()]
    assert special.encode() not in (corpus_dir / SPLIT_FILES["train"]).read_bytes()[:used] and holding, holding
    from tests.support import stages

    with pytest.raises(UserError) as e:
        stages.shards(run.artifacts_dir, refs["corpus"], tok_ref, **s.resolved("shards").model_dump())
    message = str(e.value)
    assert f"has the special token {special!r}, which ordinary text contains (the corpus's {holding[0]} split" in (
        message
    ), message
    assert message.startswith(f"tokenizer.source {Path(settings_.source).as_uri()} (tokenizer/"), message
