"""Typed stage settings: one frozen, strict pydantic model per stage, the only home of its defaults.

A validation failure becomes one ``UserError`` naming the field, what it must be, what was given and the field's
description: ``tokenizer.num_merges must be an integer >= 0, got -1 (BPE merges to learn; ...)``.
:class:`RunOptions` says how to run, not what to build: nothing in it enters a version id.
"""

from __future__ import annotations

import os
import re
import types
import typing
import unicodedata
from typing import Annotated, Any, Literal

import annotated_types
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from mygpt.errors import UserError
from tasks.core.urls import stored_url


class Settings(BaseModel):
    """Base of every stage's settings."""

    # allow_inf_nan=False: every float setting refuses inf and nan (``lr=Infinity``) with the field's message
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)
    #: The fields that hold free text (a prompt), where a tab or a newline may be meant; every other string is a
    #: path, URL or name, where no control character is.
    TEXT_FIELDS: typing.ClassVar[frozenset[str]] = frozenset()
    #: The fields that hold a source's address: their JSON form (version id, manifest, UI, Prefect's parameters)
    #: never carries its credentials (:func:`tasks.core.urls.stored_url`).
    URL_FIELDS: typing.ClassVar[frozenset[str]] = frozenset()
    #: Fields added after versions were published: out of the version id while unset (null, 0, false), so a
    #: version built without them keeps the id it had before they existed.
    LATER_FIELDS: typing.ClassVar[frozenset[str]] = frozenset()
    _resolved: bool = PrivateAttr(False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_control_characters(cls, value: Any, info: ValidationInfo) -> Any:
        # Settings travel to the Prefect server as the flow run's parameters: PostgreSQL cannot store a NUL or a
        # lone surrogate (it refuses the whole run, after its retries), and a path with a NUL crashes the stage.
        field = str(info.field_name)
        texts = [value] if isinstance(value, str) else list(value) if isinstance(value, list | tuple) else []
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                continue
            found = (_UNSTORABLE if field in cls.TEXT_FIELDS else _CONTROL).search(text)
            at = found.start() if found else None if field in cls.TEXT_FIELDS else _invisible(text)
            if at is not None:  # the value itself is not quoted: a URL's credentials would be
                ch, item = text[at], f" of item {i + 1}" if not isinstance(value, str) else ""
                where = f"({ascii(ch)[1:-1]}, at character {at + 1}{item})"
                if ch == "\x00" or "\ud800" <= ch <= "\udfff":
                    what = "a NUL character" if ch == "\x00" else "a lone surrogate"
                    raise ValueError(f"{field} holds {what} {where}, which the Prefect server cannot store; remove it")
                what = "a control character" if found else "an invisible, bidi-control or line-separator character"
                raise ValueError(f"{field} holds {what} {where}, which no path, URL or name has; remove it")
        return value

    @model_serializer(mode="wrap")
    def _without_credentials(self, handler, info):
        data = handler(self)
        if info.mode_is_json():
            for name in self.URL_FIELDS & data.keys():
                data[name] = data[name] and stored_url(data[name])
        return data

    @classmethod
    def parse(cls, value: Any, name: str = "") -> typing.Self:
        """``value`` (an instance, a dict or None) as a valid instance, else ``UserError`` naming ``name.field``."""
        if isinstance(value, cls):
            return value
        if isinstance(value, BaseModel):  # e.g. another Settings class, or an instance from a reloaded module
            value = value.model_dump()
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise UserError(
                f"{name or cls.__name__} must be an object of settings ({', '.join(cls.model_fields)}), got {value!r}"
            )
        try:
            return cls.model_validate(value)
        except ValidationError as e:
            raise UserError(cls._explain(e, value, name)) from None

    def resolved(self) -> typing.Self:
        """These settings with what depends on this machine settled (``device="auto"`` -> ``"cpu"``); a stage
        builds with, and versions by, resolved settings. Default: unchanged. Callers use :meth:`resolved_once`."""
        return self

    def resolved_once(self) -> typing.Self:
        """:meth:`resolved`, marked: settings this returned come back as they are (resolution asks torch)."""
        if self._resolved:
            return self
        settled = self.resolved()
        settled = settled.model_copy() if settled is self else settled
        settled._resolved = True
        return settled

    def model_copy(self, *, update: typing.Mapping[str, Any] | None = None, deep: bool = False) -> typing.Self:
        copy = super().model_copy(update=update, deep=deep)
        if update:
            copy._resolved = False  # a changed field may need resolving again
        return copy

    def skipped(self) -> bool:
        """Whether the flow leaves this stage out (``export.enabled=false``). Default: never."""
        return False

    def check_against(self, groups: typing.Mapping[str, Settings]) -> None:
        """Check these settings against the other stages' (``groups``, by name) before any stage runs; ``UserError``
        naming the fields. The one home of each cross-stage check. Default: none."""

    def warnings(self) -> list[str]:
        """What in these settings runs but is likely not meant (the flow logs each and the run summary lists
        them); each names the fields. Default: none."""
        return []

    def version_params(self) -> dict:
        """What this stage's version id is computed from (all fields, JSON-shaped; those of :data:`LATER_FIELDS`
        only where set)."""
        return {k: v for k, v in self.model_dump(mode="json").items() if v or k not in self.LATER_FIELDS}

    def progress_unit(self) -> tuple[str, float] | None:
        """``(unit, units per progress step)`` for the build's rate (``("B", 1)``); None: only the ETA."""
        return None

    @classmethod
    def _explain(cls, error: ValidationError, value: dict, prefix: str) -> str:
        err = error.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else ""
        where = f"{prefix}." if prefix else ""
        if err["type"] == "extra_forbidden":
            unknown = sorted(set(value) - set(cls.model_fields))
            return (
                f"unknown {prefix or cls.__name__} setting(s) {', '.join(unknown)}; the settings are "
                f"{', '.join(cls.model_fields)}"
            )
        if err["type"] == "value_error":  # one of our own checks: its message says it all
            message = str(err.get("ctx", {}).get("error", err["msg"]))
            if not field:  # a check of several fields: one that starts with a field's name reads as that field's
                named = message.split(" ", 1)[0] in cls.model_fields
                return f"{where}{message}" if named else f"{prefix or cls.__name__}: {message}"
            return f"{where}{message}" if message.startswith(field + " ") else f"{where}{field}: {message}"
        info = cls.model_fields[field]
        got = value.get(field, err.get("input"))
        hint = f" ({info.description})" if info.description else ""
        requirement = _requirement(info.annotation, info.metadata)
        if err["type"] == "finite_number" and "finite" not in requirement:
            requirement = requirement.replace("number", "finite number", 1)
        return f"{where}{field} must be {requirement}, got {got!r}{hint}"


def _bound(value: Any) -> str:
    """A bound as a message shows it: an integer whole, a float short (``1e+06``, ``1``)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _requirement(annotation: Any, metadata: list) -> str:
    """``an integer >= 1``, ``a positive number``, ``one of a, b``, ``true or false``, ... for a field."""
    bounds = []
    for m in metadata:
        if isinstance(m, annotated_types.Ge):
            bounds.append(f">= {_bound(m.ge)}")
        elif isinstance(m, annotated_types.Gt):
            bounds.append(f"> {_bound(m.gt)}")
        elif isinstance(m, annotated_types.Le):
            bounds.append(f"<= {_bound(m.le)}")
    args = typing.get_args(annotation)
    is_union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    options = [a for a in args if a is not type(None)] if is_union else [annotation]
    positive = float in options and bounds[:1] == ["> 0"]  # "a positive number", then any upper bound
    if positive:
        bounds = bounds[1:]
    if len(bounds) == 2:
        bounds = [" and ".join(bounds)]
    kinds = []
    for t in options:
        if typing.get_origin(t) is Literal:
            kinds.append("one of " + ", ".join(map(str, typing.get_args(t))))
        elif t is float and positive:
            kinds.append("a positive number")
        else:
            name: str = getattr(t, "__name__", str(t))
            kinds.append(_KINDS.get(t) or _KINDS.get(typing.get_origin(t)) or name)
    text = " or ".join(kinds) + "".join(" " + b for b in bounds)
    return text + (" (or null)" if is_union and type(None) in args else "")


_KINDS = {
    bool: "true or false",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list of strings",
    tuple: "a list of strings",
}


# Upper bounds of the run options: far above anything useful, far below what breaks a machine.
MAX_WORKERS = 256
MAX_THREADS = 1024
MAX_CHUNK_BYTES = 1 << 30
# The smallest chunk: each chunk is a Dask task with a fixed cost, which must stay below the chunk's own work.
MIN_CHUNK_BYTES = 1000
# What every generator the stages seed accepts (torch takes < 2**64; training also seeds seed + 1).
MAX_SEED = 2**63 - 1
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]


#: What no stored text may hold: NUL and lone surrogates (UTF-8 and PostgreSQL have no form of them).
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")
#: ... nor a path, URL or name: any C0 or C1 control character and DEL too.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
#: ... nor, in a path, URL or name, what is not seen or moves what is: format characters (bidi controls such as
#: U+202E, zero-width ones such as U+200B) and the line and paragraph separators U+2028/U+2029. A prompt is text
#: and keeps them.
_INVISIBLE = ("Cf", "Zl", "Zp")


def _invisible(text: str) -> int | None:
    """Where ``text``'s first :data:`_INVISIBLE` character is, or None."""
    if text.isascii():
        return None
    return next((i for i, ch in enumerate(text) if unicodedata.category(ch) in _INVISIBLE), None)


class RunOptions(Settings):
    """How to run the pipeline, not what it builds: nothing here enters a version id."""

    TINY: typing.ClassVar[dict] = {"workers": 1, "threads": 1}  # the run options' part of the tiny preset

    artifacts_dir: str | None = Field(
        None,
        description="the artifact root: a directory or s3://bucket/prefix (credentials and endpoint from the AWS "
        "environment); null = $WIKI_PIPELINE_ARTIFACTS, else artifacts/ in the checkout",
    )
    force: tuple[str, ...] = Field(
        (),
        strict=False,
        description='stages to rebuild even though a valid version exists, e.g. ["tokenizer"] (a stage may also be '
        "named by its older verb: download = corpus, bpe = tokenizer, encode = shards, train = model, "
        "sample = samples)",
    )
    full_check: bool = Field(False, description="verify every reused file's sha256, not only its size")
    only: str | None = Field(
        None,
        description="run only this stage, against the latest published upstream versions (its name, or its older "
        "verb: download = corpus, bpe = tokenizer, encode = shards, train = model, sample = samples)",
    )
    workers: int | None = Field(
        None,
        ge=1,
        le=MAX_WORKERS,
        description="worker processes of the local Dask cluster the tokenizer and shards "
        "stages start; null = CPU count (at most 8); not used with dask_address",
    )
    chunk_bytes: int | None = Field(
        None,
        ge=MIN_CHUNK_BYTES,
        le=MAX_CHUNK_BYTES,
        description="bytes of text per tokenizer/encode chunk; null = 8 MiB (speed and "
        "memory only: the outputs are the same)",
    )
    dask_address: str | None = Field(
        None,
        description="run the tokenizer and shards stages' chunk work on this "
        "existing Dask scheduler (tcp://host:port, e.g. tcp://10.0.0.5:8786, or tls://host:port with Dask's "
        "distributed.comm.tls.* settings) instead of a local cluster; its workers must see the corpus at the "
        "same path (a shared filesystem). A deployment run may name only the schedulers its worker's "
        "WIKI_PIPELINE_ALLOWED_SCHEDULERS lists (a scheduler runs code in the flow run)",
    )
    threads: int | None = Field(
        None,
        ge=0,
        le=MAX_THREADS,
        description="torch CPU threads for training and sampling; null or 0 = torch's default",
    )

    # force and only name stages: their shapes are checked here, the names against tasks.registry (the one list
    # of stages, which sits above this module) by tasks.registry.check_run, where the flow parses its settings.
    @field_validator("force", mode="before")
    @classmethod
    def _force_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple, set, frozenset)):
            raise ValueError(f"force must be a list of stage names, got {value!r}")
        return tuple(value)

    @field_validator("only", mode="before")
    @classmethod
    def _only_blank(cls, value: Any) -> Any:
        return None if value == "" else value

    @field_validator("dask_address")
    @classmethod
    def _dask_address(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        from tasks.dask.work import check_address  # the check's home: with the code that connects

        return check_address(value)

    @field_validator("artifacts_dir")
    @classmethod
    def _root_is_a_directory(cls, value: str | None) -> str | None:
        if not value:
            return value
        if value.strip().lower().startswith("s3://"):
            from tasks.store import normal_url

            return normal_url(value)  # ValueError saying what is wrong with the URL
        if "://" in value or value.strip().lower().startswith("s3:"):
            raise ValueError(
                f"artifacts_dir {value.split('://')[0]}://...: the artifact root is a local directory or an "
                "s3://bucket/prefix URL (any S3-compatible service, through AWS_ENDPOINT_URL)"
            )
        path = os.path.abspath(os.path.expanduser(value))
        while not os.path.exists(path) and os.path.dirname(path) != path:  # the nearest part that exists
            path = os.path.dirname(path)
        if os.path.exists(path) and not os.path.isdir(path):
            where = "is a file" if path == os.path.abspath(os.path.expanduser(value)) else f"is inside {path}, a file"
            raise ValueError(f"artifacts_dir {value} {where}, not a directory; give a directory for the artifacts")
        from pathlib import Path

        from tasks.store.layout import enclosing_root  # the rule's home, checked here before anything starts

        inside = enclosing_root(Path(os.path.abspath(os.path.expanduser(value))))
        if inside is not None:
            raise ValueError(
                f"artifacts_dir {value} is inside {inside}: a root there would write into that root's versions; "
                "choose a directory outside it"
            )
        return value

    @model_validator(mode="after")
    def _workers_fit(self) -> RunOptions:
        # The chunk work is CPU-bound and each worker is a process of its own (tens of MiB idle, more with a
        # tokenizer loaded): more workers than cores costs memory and buys nothing. Unused with dask_address.
        cores = os.cpu_count() or 1
        if self.workers is not None and self.dask_address is None and self.workers > cores:
            raise ValueError(
                f"workers ({self.workers}) is more than the {cores} CPU cores here; each Dask worker is a process "
                f"doing CPU-bound chunk work, so more workers than cores only costs memory: lower workers (or "
                f"null = the CPU count, at most 8)"
            )
        return self

    def root(self) -> str:
        """The artifact root: an absolute path or an ``s3://bucket/prefix`` URL."""
        from tasks.store import absolute_root, default_root

        return absolute_root(self.artifacts_dir or default_root())


class DeviceSettings(Settings):
    """``device`` and ``precision``, for the stages that run the model; part of the version once resolved (a
    model trained in bf16 on a GPU is not the one fp32 on a CPU would give)."""

    device: str = Field("auto", description="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps")
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="auto = bf16 on cuda (with bf16) and mps, fp32 elsewhere; fp32; bf16 (autocast)"
    )

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", value.strip().lower()):
            raise ValueError(f"unknown device {value!r}; expected auto, cpu, cuda, cuda:N or mps")
        return value.strip().lower()

    def resolved(self) -> typing.Self:
        """``device``/``precision`` as this machine runs them; ``UserError`` when one is not available here.
        Torch is not imported where the answer is the CPU anyway: a cached rerun never loads it."""
        from mygpt.limits import cpu_precision, resolves_to_cpu

        if resolves_to_cpu(self.device):
            try:
                return self.model_copy(update={"device": "cpu", "precision": cpu_precision(self.precision)})
            except UserError as e:
                raise UserError(f"precision: {e}") from None
        from mygpt.device import resolve_device, resolve_precision

        try:
            device = resolve_device(self.device)
        except UserError as e:
            raise UserError(f"device: {e}") from None
        try:
            precision = resolve_precision(device, self.precision)
        except UserError as e:
            raise UserError(f"precision: {e}") from None
        return self.model_copy(update={"device": str(device), "precision": precision})
