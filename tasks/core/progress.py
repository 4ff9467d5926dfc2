"""How fast a build goes and when it will be done, as the progress lines say it."""

from __future__ import annotations

from tasks.core.report import human_bytes


class Pace:
    """``5.1k tokens/s wall-clock · ETA 12m`` from a build's progress calls, measured from the first call of the
    current phase (a new ``total`` or a ``done`` going back), so a resumed build's ETA counts only the work left.
    A rate of a unit other than bytes says ``wall-clock``: it counts everything since the phase began (start-up,
    evaluation, checkpoints), where training's own ``throughput:`` line counts its steps' time only."""

    def __init__(self, unit: tuple[str, float] | None = None) -> None:
        self.unit = unit
        self.start: tuple[float, float, float] | None = None  # (time, done, total) at the phase's first call
        self.last_done = 0.0

    def update(self, done: float, total: float, now: float) -> str:
        if self.start is None or total != self.start[2] or done < self.last_done:
            self.start = (now, done, total)
        self.last_done = done
        t0, done0, _ = self.start
        if now <= t0 or done <= done0:
            return ""
        per_second = (done - done0) / (now - t0)
        parts = [self._rate(per_second)] if self.unit else []
        if total > done:
            parts.append("ETA " + human_seconds((total - done) / per_second))
        return " · ".join(parts)

    def _rate(self, per_second: float) -> str:
        assert self.unit is not None  # update() asks for a rate only with a unit
        name, scale = self.unit
        value = per_second * scale
        if name == "B":
            return f"{human_bytes(value)}/s"
        for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
            if value >= factor:
                return f"{value / factor:.1f}{suffix} {name}/s wall-clock"
        return f"{value:.1f} {name}/s wall-clock"


def human_seconds(seconds: float) -> str:
    """``45s``, ``12m05s``, ``2h03m``."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
