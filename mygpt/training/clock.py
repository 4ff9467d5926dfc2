"""How fast training goes, measured so the numbers mean one thing: :class:`StepClock` adds up the time of training
steps between the loop's synchronisation points, with this process's first step (CUDA initialisation, cuBLAS
setup, compilation) timed on its own and left out, since it would understate tokens/s and MFU by as much as it
took; validation and checkpoint writes are left out too."""

from __future__ import annotations

from time import perf_counter

__all__ = ["StepClock"]


class StepClock:
    """Steps ``first`` to ``last`` of one process's run. The loop calls :meth:`step_done` after every step,
    :meth:`warmed_up` once the device has finished the first step when it says so, and :meth:`interval` then
    :meth:`restart` around each synchronisation point."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last
        #: the first step's seconds, when more steps follow it (a one-step run has no other to compare with)
        self.warmup_seconds: float | None = None
        self.seconds = 0.0  # training seconds counted so far, without the warm-up step
        self.steps = 0  # steps counted so far, without the warm-up step
        self._start = perf_counter()
        self._interval_steps = 0
        self._warmup_inside = False  # whether the current interval holds the warm-up step
        self._estimated = False

    def step_done(self, step: int) -> bool:
        """Count ``step``; ``True`` when it is the warm-up step, to be timed on its own after a synchronisation."""
        self._interval_steps += 1
        return step == self.first and self.first < self.last

    def warmed_up(self) -> None:
        self.warmup_seconds = perf_counter() - self._start
        self._warmup_inside = True

    def interval(self, tokens_per_step: int) -> float:
        """Tokens/s since the last :meth:`restart` (the device synchronised): without the warm-up step where the
        interval has others, the warm-up's own rate where it is the interval's only step. Counts the interval."""
        elapsed, steps = perf_counter() - self._start, self._interval_steps
        if self._warmup_inside and self.warmup_seconds is not None:
            if steps == 1:
                return tokens_per_step / elapsed if elapsed > 0 else 0.0
            elapsed, steps = elapsed - self.warmup_seconds, steps - 1
        self.seconds += elapsed
        self.steps += steps
        return steps * tokens_per_step / elapsed if elapsed > 0 else 0.0

    def restart(self) -> None:
        self._start, self._interval_steps, self._warmup_inside = perf_counter(), 0, False

    def tokens_per_sec(self, tokens_per_step: int) -> float:
        """The run's throughput over the counted steps."""
        return self.steps * tokens_per_step / self.seconds if self.seconds > 0 else 0.0

    def span(self) -> str:
        """What :meth:`tokens_per_sec` covers, for the throughput line."""
        if self.warmup_seconds is None:
            return f" over step {self.first} (its only step: warm-up included)"
        steps = f"step {self.last}" if self.last == self.first + 1 else f"steps {self.first + 1}-{self.last}"
        return f" over {steps} (warm-up, validation and checkpoints left out)"

    def warmup_line(self, compiled: bool) -> str:
        """The log line for the warm-up step (only when :attr:`warmup_seconds` is set)."""
        what = "compilation, device setup" if compiled else "device setup"
        return (
            f"warm-up: step {self.first} took {self.warmup_seconds:.2f} s ({what} and first allocations), "
            f"left out of the throughput below"
        )

    def estimate_line(self, step: int) -> str | None:
        """Once, at the first synchronisation point with counted steps (``step`` just done): the whole run's wall
        time at their pace, the chapter's "time 50 steps and extrapolate" done by the tool (validation and
        checkpoints left out, so a lower bound where they are frequent); ``None`` before and after."""
        if self._estimated or self.steps == 0 or step >= self.last:
            return None
        self._estimated = True
        per_step = self.seconds / self.steps
        total = self.last - self.first + 1
        whole = (self.warmup_seconds if self.warmup_seconds is not None else per_step) + per_step * (total - 1)
        return (
            f"estimate: the run's {total:,} steps take about {_duration(whole)} ({per_step:.3g} s per step over "
            f"{self.steps:,} timed step(s); {_duration(per_step * (self.last - step))} from now)"
        )


def _duration(seconds: float) -> str:
    """``"42 s"``, ``"7.5 min"``, ``"3.2 h"``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
