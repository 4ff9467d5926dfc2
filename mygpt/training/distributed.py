"""Run a training job in one process or data-parallel in several (``torch.distributed.run``, a.k.a. torchrun).

The API a caller (the pipeline's train stage, ``mygpt train --nproc``) uses::

    job = TrainJob(tokenizer="tokenizer.json", train_tokens=["train.bin"], val_tokens="valid.bin",
                   token_dtype="uint16", model={"embed_dim": 192, "num_layers": 4, "num_heads": 6,
                   "num_kv_heads": 2, "max_seq_len": 256, "norm_type": "rms", "position_type": "rope"},
                   train=asdict(TrainConfig(...)), device="auto", checkpoint="work/train.ckpt",
                   output="out/model.ckpt", meta={...})
    nproc = resolve_nproc("auto", job.device)                                          # -> a number
    result = run_training(job, nproc, log=print, on_progress=..., on_checkpoint=...)   # -> TrainResult

The job (:class:`TrainJob`, JSON-able: ``job.to_dict()`` / ``TrainJob.from_dict``) names everything by file:

* ``tokenizer`` -- a tokenizer file (``BPETokenizer.save``'s JSON, or ``{"kind", "state"}``; see
  :mod:`mygpt.tokenizers.files`); ``model`` -- :class:`mygpt.model.GPTConfig` fields (``vocab_size`` comes from the
  tokenizer; ``GPTConfig``'s defaults fill the rest);
  ``train`` -- ``TrainConfig`` fields (``batch_size`` is the global batch).
* ``train_tokens`` -- flat binary token files (``token_dtype``, native byte order, no header), memory-mapped
  with numpy and read as one concatenated sequence; ``val_tokens`` -- one such file (or none).
* ``checkpoint`` -- the resume checkpoint: resumed from when it exists and ``resume`` is true, rewritten every
  ``checkpoint_every`` steps and at the end (by rank 0; the format of ``mygpt.training.train``).
* ``output`` -- the final model without optimizer or resume state (what ``mygpt generate`` loads), written at
  the end; ``meta`` goes into both files. At least one of ``checkpoint``/``output`` is needed.
* ``threads`` -- torch intra-op threads per process (0: leave the default; torchrun makes it 1 per process).

``nproc`` (processes on this node, a number: :func:`resolve_nproc` turns ``"auto"`` or a string into one and
checks it against the machine, once, before ``run_training``): ``1`` trains in this process, exactly as calling
``mygpt.training.train.train`` (the model is built after ``torch.manual_seed(seed)``). With ``nproc > 1`` the launcher
runs::

    python -m torch.distributed.run --standalone --nproc-per-node N --max-restarts 0 \\
        -m mygpt.training.distributed worker RUN_DIR/job.json

as a child in its own process group (NCCL on CUDA, one GPU per process; gloo on CPU) and waits for it.

What comes back while it runs: rank 0 appends JSON lines to ``RUN_DIR/events.jsonl``
(``{"event": "log", "message": ...}``, ``{"event": "progress", "point": {...}}``,
``{"event": "checkpoint", "step": ..., "path": ...}``) and the launcher calls ``log(message)``,
``on_progress(point)`` and ``on_checkpoint(step, path)`` in the calling thread with exactly what
``mygpt.training.train.train`` would pass in-process, plus one first ``log`` line naming the processes and the run
directory. Progress points carry ``step``, ``steps``, ``loss``, ``lr``, ``tokens_per_sec``, ``tflops``, ``mfu``
and, at evaluations, ``val_loss`` and ``val_bpb``. Each rank's stdout/stderr is in ``RUN_DIR/rank-R.log``,
torchrun's own output in ``RUN_DIR/launcher.log`` and its files in ``RUN_DIR/torchelastic`` (its ``--log-dir``:
nothing is left in TMPDIR).

Failures:

* A ``UserError`` in a worker (say the checkpoint was written with other settings) is raised again here as
  ``UserError`` with the worker's message.
* Any other failure raises :class:`TrainingProcessError` naming the rank that failed first (a rank that only
  lost contact with it, or that torchrun stopped afterwards, is not blamed), its exit code or signal, and the
  tail of its log. torchrun notices a dead worker within its monitor interval (0.1 s) and stops the others, so
  a rank dying alone never hangs the run. The checkpoint stays: rerunning the same job resumes from it.
* The launcher kills its child process group when it is interrupted or a callback raises; the torchrun agent
  and every worker are also set to die with their parent (``mygpt.training.orphan_guard``), so SIGKILL of the caller
  (or of its whole process group) leaves no training process behind.

Resume: every rank loads the checkpoint and restores the same weights, optimizer, batch-generator, numpy and
python RNG states (and its own torch RNG state when the world size is unchanged), so a killed run resumes to
the same weights as an uninterrupted run of the same world size (bit-identical on CPU/fp32). A checkpoint from
another world size resumes too (same batch math; equal up to float rounding).

One node only: torchrun runs ``--standalone``.

Test hooks (environment of the workers, e.g. ``run_training(..., env={...})``):
``MYGPT_TEST_STALL_AFTER_CHECKPOINT=1`` makes rank 0 stall after its first periodic checkpoint (a test can then
SIGKILL at a known point); ``MYGPT_TEST_EXIT_RANK=R:S:C`` makes rank ``R`` exit with code ``C`` after step ``S``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TextIO, cast

from mygpt.atomic import atomic_write_text
from mygpt.errors import UserError, check_int

__all__ = ["EXIT_RANK_ENV", "STALL_ENV", "TrainJob", "TrainingProcessError", "resolve_nproc", "run_training"]

STALL_ENV = "MYGPT_TEST_STALL_AFTER_CHECKPOINT"
EXIT_RANK_ENV = "MYGPT_TEST_EXIT_RANK"
RUN_DIR_ENV = "MYGPT_RUN_DIR"
LAUNCHER_ENV = "MYGPT_LAUNCHER_PID"
#: torchrun's ``--log-dir`` in the run directory (else torch elastic makes a ``torchelastic_*`` dir in TMPDIR and
#: leaves it there)
ELASTIC_DIR = "torchelastic"
TAIL_LINES = 25


class TrainingProcessError(RuntimeError):
    """A training process failed (not a ``UserError``): which rank, how it ended, the tail of its log."""

    def __init__(
        self,
        message: str,
        *,
        rank: int | None,
        exit_code: int | None,
        world_size: int,
        log_tail: str,
        run_dir: str,
        checkpoint_step: int | None,
    ) -> None:
        super().__init__(message)
        self.rank, self.exit_code, self.world_size = rank, exit_code, world_size
        self.log_tail, self.run_dir, self.checkpoint_step = log_tail, run_dir, checkpoint_step


# ---- the job ----------------------------------------------------------------------------------------------
@dataclass
class TrainJob:
    """Everything a training process needs, by file (see the module docstring)."""

    tokenizer: str
    train_tokens: list
    model: dict
    train: dict
    checkpoint: str | None = None
    val_tokens: str | None = None
    token_dtype: str = "uint16"
    device: str = "auto"
    resume: bool = True
    output: str | None = None
    meta: dict | None = None
    threads: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.train_tokens, (str, os.PathLike)):
            self.train_tokens = [self.train_tokens]
        self.train_tokens = [os.fspath(p) for p in self.train_tokens]
        for name in ("tokenizer", "checkpoint", "val_tokens", "output"):
            value = getattr(self, name)
            if isinstance(value, os.PathLike):
                setattr(self, name, os.fspath(value))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainJob:
        if not isinstance(d, dict):
            raise UserError(f"a training job must be a JSON object, got {type(d).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise UserError(f"training job has unknown field(s) {unknown}; known: {sorted(names)}")
        missing = sorted(
            f.name for f in fields(cls) if f.name in ("tokenizer", "train_tokens", "model", "train") and f.name not in d
        )
        if missing:
            raise UserError(f"training job lacks field(s) {missing}")
        return cls(**d)

    def save(self, path) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path) -> TrainJob:
        try:
            with open(path, encoding="utf-8") as f:
                return cls.from_dict(json.load(f))
        except (OSError, json.JSONDecodeError) as e:
            raise UserError(f"cannot read training job {os.fspath(path)}: {e}") from None

    # -- what the processes build from it ----------------------------------------------------------------
    def config(self):
        from mygpt.training.train import TrainConfig

        if not isinstance(self.train, dict):
            raise UserError(f"job 'train' must be an object of TrainConfig fields, got {type(self.train).__name__}")
        names = {f.name for f in fields(TrainConfig)}
        unknown = sorted(set(self.train) - names)
        if unknown:
            raise UserError(f"job 'train' has unknown TrainConfig field(s) {unknown}; known: {sorted(names)}")
        return TrainConfig(**self.train).validate()

    def open_data(self):
        """``(tokenizer, train tokens, validation tokens or None)``, the token files memory-mapped."""
        from mygpt.tokenizers.files import load_tokenizer_file
        from mygpt.training.data import open_token_files

        tokenizer = load_tokenizer_file(self.tokenizer)
        train_tokens = open_token_files(self.train_tokens, self.token_dtype)
        val_tokens = open_token_files([self.val_tokens], self.token_dtype) if self.val_tokens else None
        return tokenizer, train_tokens, val_tokens

    def gpt_config(self, tokenizer):
        """The model's :class:`~mygpt.model.GPTConfig`: ``model`` with ``vocab_size`` from the tokenizer
        (``UserError`` naming what is wrong)."""
        from mygpt.gpt_config import GPTConfig

        if not isinstance(self.model, dict):
            raise UserError(f"job 'model' must be an object of GPTConfig fields, got {type(self.model).__name__}")
        vocab = self.model.get("vocab_size", tokenizer.vocab_size)
        if vocab != tokenizer.vocab_size:
            raise UserError(
                f"job 'model' has vocab_size {vocab}, but the tokenizer {self.tokenizer} has "
                f"{tokenizer.vocab_size}; drop vocab_size (it comes from the tokenizer)"
            )
        return GPTConfig.from_dict({**self.model, "vocab_size": vocab}, "job 'model'")

    def build_model(self, tokenizer):
        """The initial model: ``torch.manual_seed(seed)`` then ``GPT(config)`` (as ``mygpt train`` does)."""
        import torch

        from mygpt.model import GPT

        config = self.gpt_config(tokenizer)
        torch.manual_seed(self.config().seed)
        return GPT(config)

    def check(self, nproc: int = 1) -> None:
        """Cheap checks before any process starts; ``UserError`` naming the field."""
        from mygpt.device import resolve_device, resolve_precision
        from mygpt.limits import check_memory, check_nproc, check_seq_len

        if not self.checkpoint and not self.output:
            raise UserError("training job needs 'checkpoint' or 'output' (or both): where the trained weights go")
        if not isinstance(self.resume, bool):
            raise UserError(f"job 'resume' must be true or false, got {self.resume!r}")
        check_int("threads", self.threads, 0)
        config = self.config()
        tokenizer, train_tokens, _val_tokens = self.open_data()
        model = self.gpt_config(tokenizer)
        check_seq_len(
            config.seq_len,
            model.max_seq_len,
            names=("job 'train' seq_len", "the model's max_seq_len"),
            hint="lower seq_len or raise max_seq_len",
        )
        if len(train_tokens) < config.seq_len + 1:
            raise UserError(
                f"the training token files hold {len(train_tokens):,} tokens, fewer than one window "
                f"of seq_len + 1 = {config.seq_len + 1:,}"
            )
        check_nproc(config.batch_size, nproc)
        device = resolve_device(self.device)
        check_memory(
            model,
            config.batch_size,
            config.seq_len,
            device=device,
            precision=resolve_precision(device, config.precision),
            nproc=nproc,
            micro_batch_size=config.micro_batch_size,
        )


# ---- how many processes -----------------------------------------------------------------------------------
def resolve_nproc(nproc: int | str, device: str = "auto") -> int:
    """``nproc`` as a number: ``"auto"`` = visible GPUs when ``device`` resolves to CUDA, else 1. Torch-free where
    ``device`` resolves to the CPU without it (:func:`mygpt.limits.resolves_to_cpu`)."""
    from mygpt.limits import resolves_to_cpu

    if resolves_to_cpu(device):
        kind, index = "cpu", None
    else:
        from mygpt.device import resolve_device

        dev = resolve_device(device)
        kind, index = dev.type, dev.index
    if isinstance(nproc, str):
        text = nproc.strip().lower()
        if text == "auto":
            return max(1, __import__("torch").cuda.device_count()) if kind == "cuda" else 1
        if not text.isdigit():
            raise UserError(f"nproc must be a positive integer or 'auto', got {nproc!r}")
        nproc = int(text)
    n = check_int("nproc", nproc, 1, "use 'auto' for one process per visible GPU")
    if n > 1:
        if kind == "mps":
            raise UserError("nproc > 1 is not supported on Apple MPS (no distributed backend); use nproc 1")
        if kind == "cuda":
            import torch

            if index is not None:
                raise UserError(
                    f"device {device!r} pins one GPU, but nproc is {n}; use device 'cuda' (or 'auto') "
                    f"and each process takes its own GPU"
                )
            if n > torch.cuda.device_count():
                raise UserError(
                    f"nproc ({n}) is more than the {torch.cuda.device_count()} visible GPU(s); "
                    f"lower nproc or use 'auto'"
                )
        if not hasattr(os, "killpg"):
            raise UserError("nproc > 1 needs a POSIX system (process groups); use nproc 1")
    return n


# ---- the launcher -----------------------------------------------------------------------------------------
def run_training(
    job: TrainJob | dict,
    nproc: int = 1,
    *,
    log: Callable[[str], None] | None = print,
    on_progress: Callable[[dict], None] | None = None,
    on_checkpoint: Callable[[int, str], None] | None = None,
    env: dict | None = None,
    run_dir: str | os.PathLike | None = None,
):
    """Train ``job`` with ``nproc`` processes (a number, see :func:`resolve_nproc`); return the ``TrainResult``
    (see the module docstring).

    ``env``: extra environment for the processes (``nproc > 1``). ``run_dir``: where the job file, the event
    stream and the per-rank logs go (default: a temporary directory, removed after success, kept after a
    failure).
    """
    if isinstance(job, dict):
        job = TrainJob.from_dict(job)
    log = log or (lambda _msg: None)
    check_int("nproc", nproc, 1, "resolve 'auto' with mygpt.training.distributed.resolve_nproc")
    job.check(nproc)
    if nproc == 1:
        return _train_here(job, log, on_progress, on_checkpoint)
    return _launch(job, nproc, log, on_progress, on_checkpoint, env or {}, run_dir)


def _train_here(job: TrainJob, log, on_progress, on_checkpoint):
    from mygpt.device import torch_threads
    from mygpt.training.parallel import World

    with torch_threads(job.threads):
        return _train_job(job, job.config(), job.device, World(), log, on_progress, on_checkpoint)


def _train_job(job: TrainJob, config, device, world, log, on_progress, on_checkpoint):
    """This process's part of the job: open the data, build the model, train; rank 0 writes ``output``."""
    from mygpt.checkpoint import save_checkpoint
    from mygpt.training.train import train

    tokenizer, train_tokens, val_tokens = job.open_data()
    model = job.build_model(tokenizer)
    result = train(
        model,
        tokenizer,
        train_tokens,
        config=config,
        val_tokens=val_tokens,
        device=device,
        checkpoint_path=job.checkpoint,
        resume=job.resume,
        log=log,
        on_progress=on_progress,
        on_checkpoint=on_checkpoint,
        meta=job.meta,
        world=world,
    )
    if world.is_main and job.output:
        save_checkpoint(model, tokenizer, job.output, meta=job.meta)
    return result


class _EventReader:
    """Complete JSON lines appended to a file since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file: TextIO | None = None
        self.partial = ""

    def read(self) -> list[dict]:
        if self.file is None:
            try:
                self.file = open(self.path, encoding="utf-8")  # noqa: SIM115 (tailed across calls)
            except FileNotFoundError:
                return []
        chunk = self.file.read()
        if not chunk:
            return []
        *lines, self.partial = (self.partial + chunk).split("\n")
        return [json.loads(line) for line in lines if line.strip()]

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def _prepare_run_dir(run_dir) -> tuple[Path, bool]:
    if run_dir is None:
        return Path(tempfile.mkdtemp(prefix="mygpt-train-")), True
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    for pattern in (
        "events.jsonl",
        "result.json",
        "launcher.log",
        "rank-*.log",
        "rank-*.status.json",
        "rank-*.pid",
    ):  # a previous attempt's files must not be read as this one's
        for old in path.glob(pattern):
            old.unlink()
    shutil.rmtree(path / ELASTIC_DIR, ignore_errors=True)
    return path, False


def _launch(job, nproc, log, on_progress, on_checkpoint, env, run_dir):
    from mygpt.training.train import TrainResult

    run_path, temporary = _prepare_run_dir(run_dir)
    job_path = run_path / "job.json"
    job.save(job_path)
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "--max-restarts=0",
        f"--log-dir={run_path / ELASTIC_DIR}",  # torch elastic's own files: here, not a torchelastic_* in TMPDIR
        "-m",
        "mygpt.training.distributed",
        "worker",
        str(job_path),
    ]
    cmd = [sys.executable, "-m", "mygpt.training.orphan_guard", str(os.getpid()), "--", *torchrun]
    child_env = {
        **os.environ,
        **{k: str(v) for k, v in env.items()},
        RUN_DIR_ENV: str(run_path),
        LAUNCHER_ENV: str(os.getpid()),
    }
    log(f"launching {nproc} training processes with torch.distributed.run (logs: {run_path})")
    reader = _EventReader(run_path / "events.jsonl")
    last_checkpoint: list = [None]

    def dispatch(events: list[dict]) -> None:
        for ev in events:
            kind = ev.get("event")
            if kind == "log":
                log(ev["message"])
            elif kind == "progress" and on_progress is not None:
                on_progress(ev["point"])
            elif kind == "checkpoint":
                last_checkpoint[0] = ev["step"]
                if on_checkpoint is not None:
                    on_checkpoint(ev["step"], ev["path"])

    with open(run_path / "launcher.log", "wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env, start_new_session=True
        )
    ok = False
    try:
        while True:
            dispatch(reader.read())
            rc = proc.poll()
            if rc is not None:
                dispatch(reader.read())
                break
            time.sleep(0.05)
        if rc != 0:
            error = _failure(rc, nproc, run_path, last_checkpoint[0], job)
            ok = isinstance(error, UserError)  # the message says it all: no logs to keep
            raise error
        result_path = run_path / "result.json"
        result = TrainResult.from_dict(json.loads(result_path.read_text(encoding="utf-8")))
        ok = True
        return result
    finally:
        reader.close()
        _stop(proc)
        _reap_workers(run_path, str(job_path))
        if ok and temporary:
            shutil.rmtree(run_path, ignore_errors=True)


def _stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """Stop the torchrun agent's process group: SIGTERM (it stops its workers), then SIGKILL."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # anything left in the group
    proc.wait()


def _is_ours(pid: int, marker: str) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return marker.encode() in f.read()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (macOS): trust the pid file written moments ago
        return True


def _reap_workers(run_path: Path, marker: str, wait: float = 5.0) -> None:
    """Workers live in their own sessions (torchrun's choice): make sure none outlives the launch."""
    pids = []
    for pid_file in run_path.glob("rank-*.pid"):
        with contextlib.suppress(OSError, ValueError):
            pids.append(int(pid_file.read_text().strip()))
    deadline = time.monotonic() + wait
    alive = [p for p in pids if _is_ours(p, marker)]
    while alive and time.monotonic() < deadline:  # they die with the agent (PR_SET_PDEATHSIG); give them a moment
        time.sleep(0.05)
        alive = [p for p in alive if _is_ours(p, marker)]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


# ---- explaining a failure ---------------------------------------------------------------------------------
_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*exitcode\s*:\s*(-?\d+)")


def _parse_torchrun_failures(text: str) -> tuple[dict[int, int], int | None]:
    """``({rank: exit code}, root-cause rank)`` from torchrun's ChildFailedError summary."""
    failures = {int(r): int(c) for r, c in _FAILURE.findall(text)}
    root = None
    if "Root Cause" in text:
        m = _FAILURE.search(text.split("Root Cause", 1)[1])
        root = int(m.group(1)) if m else None
    return failures, root


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "failed"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (exit code {code})"
    return f"exited with code {code}"


def _failure(rc: int, nproc: int, run_path: Path, checkpoint_step: int | None, job: TrainJob) -> Exception:
    statuses = {}
    for p in run_path.glob("rank-*.status.json"):
        with contextlib.suppress(OSError, ValueError):
            statuses[int(p.name.split("-")[1].split(".")[0])] = json.loads(p.read_text(encoding="utf-8"))
    user = sorted(r for r, s in statuses.items() if s.get("status") == "user_error")
    if user:
        return UserError(statuses[user[0]]["message"])
    launcher_text = (
        (run_path / "launcher.log").read_text(encoding="utf-8", errors="replace")
        if (run_path / "launcher.log").exists()
        else ""
    )
    failures, root = _parse_torchrun_failures(launcher_text)
    innocent = {"peer_lost", "ok"}
    culprits = [
        r
        for r, code in failures.items()
        if statuses.get(r, {}).get("status") not in innocent and code != -signal.SIGTERM
    ]
    rank: int | None
    if culprits:
        rank = root if root in culprits else min(culprits)
    elif root is not None:
        rank = root
    else:
        rank = min(failures) if failures else None
    if checkpoint_step is not None:
        resume = (
            f"the last checkpoint of this attempt is at step {checkpoint_step} ({job.checkpoint}); rerun to "
            f"resume from it"
        )
    elif job.checkpoint and os.path.exists(job.checkpoint):
        resume = f"no new checkpoint was written; rerunning resumes from the existing {job.checkpoint}"
    else:
        resume = "no checkpoint was written; a rerun starts over"
    if rank is None:
        tail = _tail(run_path / "launcher.log")
        message = (
            f"training with {nproc} processes failed: torch.distributed.run exited with code {rc} before "
            f"naming a failed rank. Last lines of {run_path / 'launcher.log'}:\n{_indent(tail)}\n{resume}"
        )
        return TrainingProcessError(
            message,
            rank=None,
            exit_code=rc,
            world_size=nproc,
            log_tail=tail,
            run_dir=str(run_path),
            checkpoint_step=checkpoint_step,
        )
    code = failures.get(rank)
    status = statuses.get(rank, {})
    log_path = run_path / f"rank-{rank}.log"
    tail = _tail(log_path)
    what = f" ({status['message']})" if status.get("message") else ""
    message = (
        f"training process rank {rank} of {nproc} {_describe_exit(code)}{what}; the other processes were "
        f"stopped. Last lines of its log {log_path}:\n{_indent(tail) or '    (empty)'}\n{resume}"
    )
    return TrainingProcessError(
        message,
        rank=rank,
        exit_code=code,
        world_size=nproc,
        log_tail=tail,
        run_dir=str(run_path),
        checkpoint_step=checkpoint_step,
    )


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


# ---- the worker (one per rank, started by torchrun) -------------------------------------------------------
class _Events:
    """Rank 0's event stream to the launcher (JSON lines, flushed per event)."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the rank's life)

    def emit(self, event: str, **data) -> None:
        self.file.write(json.dumps({"event": event, **data}) + "\n")
        self.file.flush()

    def log(self, message: str) -> None:
        print(message, flush=True)  # the rank log keeps the text too
        self.emit("log", message=message)


def _redirect_output(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # The worker's own stdio: TextIOWrappers (typed TextIO, which lacks reconfigure).
    cast(io.TextIOWrapper, sys.stdout).reconfigure(line_buffering=True)
    cast(io.TextIOWrapper, sys.stderr).reconfigure(line_buffering=True)


def _exit_hook(rank: int):
    spec = os.environ.get(EXIT_RANK_ENV, "")
    if not spec:
        return None
    r, s, c = (int(v) for v in spec.split(":"))
    if r != rank:
        return None

    def hook(step: int) -> None:
        if step == s:
            print(f"{EXIT_RANK_ENV}={spec}: rank {rank} exits with code {c} after step {step}", flush=True)
            os._exit(c)

    return hook


def _is_peer_failure(e: BaseException) -> bool:
    import torch.distributed as dist

    if isinstance(e, dist.DistError):
        return True
    text = str(e)
    return any(
        s in text for s in ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "gloo", "NCCL")
    )


def _worker(job_path: str) -> int:
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    run_path = Path(os.environ[RUN_DIR_ENV])
    _redirect_output(run_path / f"rank-{rank}.log")
    from mygpt.training.orphan_guard import GUARDED_PID_ENV, die_with_parent, watch_process

    agent = int(os.environ.get(GUARDED_PID_ENV, os.getppid()))  # the torchrun agent
    die_with_parent(agent)
    if os.environ.get(LAUNCHER_ENV):
        watch_process(int(os.environ[LAUNCHER_ENV]), parent=agent)
    (run_path / f"rank-{rank}.pid").write_text(str(os.getpid()))
    status_path = run_path / f"rank-{rank}.status.json"
    print(f"rank {rank} (local rank {local_rank}) of {os.environ.get('WORLD_SIZE')}, pid {os.getpid()}", flush=True)
    try:
        _work(TrainJob.load(job_path), rank, local_rank, run_path)
    except UserError as e:
        print(f"error: {e}", flush=True)
        atomic_write_text(status_path, json.dumps({"status": "user_error", "message": str(e)}))
        return 2
    except BaseException as e:
        traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0][:300]
        status = "peer_lost" if _is_peer_failure(e) else "error"
        atomic_write_text(status_path, json.dumps({"status": status, "message": f"{type(e).__name__}: {first}"}))
        return 1
    atomic_write_text(status_path, json.dumps({"status": "ok"}))
    return 0


def _work(job: TrainJob, rank: int, local_rank: int, run_path: Path) -> None:
    import torch
    import torch.distributed as dist

    from mygpt.device import resolve_device
    from mygpt.training.parallel import World

    dev = resolve_device(job.device)
    if dev.type == "cuda":
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", device_id=dev)
    else:
        dist.init_process_group("gloo")
    if job.threads:
        torch.set_num_threads(job.threads)
    try:
        world = World.current(step_hook=_exit_hook(rank))
        events = _Events(run_path / "events.jsonl") if rank == 0 else None
        stall = bool(os.environ.get(STALL_ENV))
        config = job.config()

        def on_checkpoint(step: int, path: str) -> None:
            assert events is not None  # passed to training only when there are events
            events.emit("checkpoint", step=step, path=path)
            if stall and step < config.steps:
                events.log(f"{STALL_ENV} is set: stalling after the checkpoint at step {step}")
                while True:
                    time.sleep(1)

        result = _train_job(
            job,
            config,
            dev,
            world,
            events.log if events else None,
            (lambda point: events.emit("progress", point=point)) if events else None,
            on_checkpoint if events else None,
        )
        if rank == 0:
            atomic_write_text(run_path / "result.json", json.dumps(result.to_dict()))
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "worker":
        print(
            "usage: python -m torch.distributed.run ... -m mygpt.training.distributed worker JOB.json "
            "(started by mygpt.training.distributed.run_training)",
            file=sys.stderr,
        )
        return 2
    return _worker(argv[1])


def _leave(code: int) -> None:
    """End a worker once its outcome is on disk (status file, result, checkpoints: all written atomically):
    flush its log and ``os._exit``. Not ``sys.exit``: interpreter shutdown then destroys whatever c10d/gloo
    objects are still alive (the store client, a process group another rank's failure left mid-operation) and
    C++ static destructors run; a gloo/c10d thread still joinable then makes libstdc++ abort the process
    (``terminate called without an active exception``, SIGABRT), so a rank that had finished its work (status
    ``ok`` or ``peer_lost``) is reported as killed by SIGABRT, and a run that succeeded fails."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover - runs in the worker processes
    from mygpt.training.distributed import _leave as _end
    from mygpt.training.distributed import main as _main  # the package's copy of this module, not __main__'s

    _end(_main())
