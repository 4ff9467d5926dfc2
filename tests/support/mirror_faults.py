"""Fault injection for the loopback mirror (``flows/mirror.py``): :class:`FaultyMirror` answers as :class:`Faults`
say (503s, a dropped connection, Range ignored, a wrong Content-Length, a stall, 404); ``set_faults`` replaces them."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

from flows.mirror import Mirror, MirrorHandler


@dataclass
class Faults:
    """Fault modes; counters count requests (or responses with a body) from when the faults were set."""

    fail_first: int = 0  # answer the first N requests with ``fail_status``
    fail_status: int = 503
    not_found: bool = False  # answer every request with 404
    drop_after: int | None = None  # close the connection after this many body bytes ...
    drop_times: int = 1  # ... in this many responses (-1: every response)
    ignore_range: bool = False  # answer Range requests with 200 and the whole file
    length_delta: int = 0  # add this to the Content-Length header (body unchanged; then close)
    length_times: int = 1  # ... in this many responses (-1: every response)
    stall: float = 0.0  # sleep this long before sending the body ...
    stall_after: int = 0  # ... after this many body bytes ...
    stall_times: int = 1  # ... in this many responses (-1: every response)
    no_validators: bool = False  # send no ETag (the mirror sends no Last-Modified): only the size
    etag_per_request: bool = False  # a different ETag on every answer (a load balancer over several origins)
    counts: dict = field(default_factory=dict)

    def take(self, name: str, times: int) -> bool:
        """Whether fault ``name`` applies to this response (and count it)."""
        used = self.counts.get(name, 0)
        if times >= 0 and used >= times:
            return False
        self.counts[name] = used + 1
        return True


class FaultyHandler(MirrorHandler):
    """The mirror's handler with its mirror's :class:`Faults` applied."""

    faults: Faults
    drop: int | None = None  # body bytes sent before the connection is closed
    stall: tuple[int, float] | None = None  # (after this many body bytes, sleep this long)

    def refusal(self) -> tuple[int, str] | None:
        mirror: FaultyMirror = self.server.mirror
        self.faults = faults = mirror.faults
        n = mirror.request_count
        mirror.request_count += 1
        if faults.not_found:
            return 404, "not found"
        if n < faults.fail_first:
            return faults.fail_status, "induced failure"
        return None

    def range_header(self) -> str | None:
        return None if self.faults.ignore_range else super().range_header()

    def response_headers(self, headers: dict[str, str]) -> dict[str, str]:
        faults = self.faults
        with self.server.mirror.lock:
            if faults.drop_after is not None and faults.take("drop", faults.drop_times):
                self.drop = faults.drop_after
            if faults.stall and faults.take("stall", faults.stall_times):
                self.stall = (faults.stall_after, faults.stall)
            delta = faults.length_delta if faults.length_delta and faults.take("length", faults.length_times) else 0
        headers["Content-Length"] = str(int(headers["Content-Length"]) + delta)
        if faults.no_validators:
            headers.pop("ETag", None)
        elif faults.etag_per_request:
            with self.server.mirror.lock:
                headers["ETag"] = f'"lb-{faults.take("etag", -1) and faults.counts["etag"]}"'
        if self.drop is not None or delta:
            headers["Connection"] = "close"  # the server then closes the connection after this answer
        return headers

    def send_body(self, body: bytes, entry: dict) -> None:
        stopping = self.server.mirror.stopping
        stall = self.stall
        limit = len(body) if self.drop is None else min(self.drop, len(body))
        pos = 0
        while pos < limit:
            if stall and pos >= stall[0]:
                if stopping.wait(stall[1]):
                    return
                stall = None
            piece = body[pos : min(limit, pos + 65536, stall[0] if stall and stall[0] > pos else limit)]
            self.wfile.write(piece)
            pos += len(piece)
            entry["sent"] = pos
        if stall and pos >= stall[0]:  # stall at the very end of the body
            stopping.wait(stall[1])
        self.wfile.flush()


class FaultyMirror(Mirror):
    """A :class:`~flows.mirror.Mirror` that answers as ``mirror.faults`` says."""

    handler = FaultyHandler

    def __init__(
        self, files: dict[str, bytes | os.PathLike] | None = None, port: int = 0, faults: Faults | None = None
    ) -> None:
        super().__init__(files, port)
        self.faults = faults or Faults()
        self.request_count = 0
        self.stopping = threading.Event()  # set by stop(): a stalled answer ends at once

    def set_faults(self, **kw) -> Faults:
        """Replace the fault modes (counters restart from the next request)."""
        with self.lock:
            self.faults = Faults(**kw)
            self.request_count = 0
        return self.faults

    def stop(self) -> None:
        self.stopping.set()
        super().stop()
