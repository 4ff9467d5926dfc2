"""The build lock on object storage: a lease taken with a conditional write and renewed by compare-and-swap."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Protocol

from mygpt.errors import UserError
from tasks.store.s3_urls import scrub

ENV_LEASE = "WIKI_PIPELINE_LEASE_SECONDS"
DEFAULT_LEASE_SECONDS = 30.0

log = logging.getLogger("wiki_pipeline.store")


def lease_seconds() -> float:
    """``$WIKI_PIPELINE_LEASE_SECONDS`` (1 to 3600), else 30."""
    raw = os.environ.get(ENV_LEASE, "").strip()
    if not raw:
        return DEFAULT_LEASE_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 1.0 <= value <= 3600.0:
        raise UserError(f"{ENV_LEASE}={raw!r}: give the build-lock lease time in seconds, 1 to 3600 (default 30)")
    return value


class Objects(Protocol):
    """The conditional requests a lease needs (:class:`tasks.store.s3.ObjectFiles` has them)."""

    def where(self, key: str) -> str: ...

    def listing(self, key: str) -> dict[str, dict]: ...

    def last_modified(self, key: str) -> float | None: ...

    def get_object(self, key: str) -> tuple[bytes, str] | None: ...

    def put_object(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str | None: ...

    def delete_object(self, key: str, if_match: str | None = None) -> bool: ...


class Lease:
    """The lock ``key``: ``acquire`` (a builder's) or ``acquire_shared`` (a reader's pin), renewed by a thread of
    its own until ``release``; docs/STORE.md gives the protocol."""

    def __init__(self, files: Objects, key: str, seconds: float) -> None:
        self.files, self.key, self.seconds = files, key, seconds
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.pin_key = f"{key}.pins/{self.holder.replace(':', '-')}"
        self.etag: str | None = None
        self.lost = False
        self._renewals = 0
        self._renewed_at = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shared = False
        self._mutex = threading.Lock()  # one renewal at a time (the thread's, or confirm's)

    def _body(self) -> bytes:
        self._renewals += 1
        return json.dumps(
            {"holder": self.holder, "renewal": self._renewals, "lease_seconds": self.seconds, "at": time.time()}
        ).encode()

    def _expiry(self, body: bytes) -> float:
        """How long another's lease must stay unchanged to be dead: the longer of ours and the holder's."""
        try:
            theirs = float(json.loads(body).get("lease_seconds", 0))
        except (ValueError, TypeError, AttributeError):
            theirs = 0.0
        return max(self.seconds, min(theirs, 3600.0)) if theirs == theirs else self.seconds

    @property
    def _poll(self) -> float:
        return min(1.0, self.seconds / 4)

    def acquire(self, wait: bool, on_wait: Callable[[], None] | None) -> bool:
        seen: tuple[str, float] | None = None  # (ETag, when first seen) of the lease another holds
        while True:
            etag = self.files.put_object(self.key, self._body(), if_none_match=True)
            if etag is None:
                current = self.files.get_object(self.key)
                if current is None:
                    time.sleep(min(0.05, self._poll))  # released between our PUT and our GET
                    continue
                body, other = current
                if not wait:
                    return False
                now = time.monotonic()
                if seen is None or seen[0] != other:
                    if seen is None and on_wait:
                        on_wait()
                    seen = (other, now)
                elif now - seen[1] > self._expiry(body):
                    etag = self.files.put_object(self.key, self._body(), if_match=other)
                    if etag is not None:
                        log.warning(
                            "lock %s: its holder stopped renewing it for %.0f s (killed, or its machine died); "
                            "taking it over",
                            self.files.where(self.key),
                            now - seen[1],
                        )
                    seen = None
                if etag is None:
                    time.sleep(self._poll)
                    continue
            self.etag = etag
            self._renewed_at = time.monotonic()
            self._start_renewing()
            try:
                if self._wait_for_pins(wait, on_wait):
                    return True
            except BaseException:
                self.release()
                raise
            self.release()
            return False

    def _wait_for_pins(self, wait: bool, on_wait: Callable[[], None] | None) -> bool:
        """Holding the lease: wait until no reader's pin is live (unchanged for a lease time while we watched, or
        written more than two lease times before our lease by the server's clock: dead)."""
        seen: dict[str, tuple[str, float, float]] = {}
        ours = None
        while True:
            listing = self.files.listing(self.key + ".pins")
            if listing and ours is None:
                ours = self.files.last_modified(self.key)
            now = time.monotonic()
            for rel, info in list(listing.items()):
                etag = str(info.get("ETag") or info.get("etag") or "")
                modified = info.get("LastModified")
                written = modified.timestamp() if modified is not None and hasattr(modified, "timestamp") else None
                first = seen.get(rel)
                if first is None or first[0] != etag:
                    pin = self.files.get_object(f"{self.key}.pins/{rel}")
                    seen[rel] = first = (etag, now, self._expiry(pin[0]) if pin else self.seconds)
                expiry = first[2]  # the longer of our lease time and the one its reader wrote into it
                stale = ours is not None and written is not None and ours - written > 2 * expiry
                if stale or now - first[1] > expiry:
                    self.files.delete_object(f"{self.key}.pins/{rel}", if_match=etag)  # its reader is gone
                    del listing[rel]
            if not listing:
                return True
            if not wait:
                return False
            if on_wait:
                on_wait()
                on_wait = None
            time.sleep(self._poll)

    def acquire_shared(self, wait: bool, on_wait: Callable[[], None] | None) -> bool:
        self._shared = True
        seen: tuple[str, float] | None = None
        while True:
            self.etag = self.files.put_object(self.pin_key, self._body())
            current = self.files.get_object(self.key)
            if current is None:
                self._renewed_at = time.monotonic()
                self._start_renewing()
                return True
            self.files.delete_object(self.pin_key)  # a builder holds the version: step back until it is done
            if not wait:
                return False
            body, other = current
            now = time.monotonic()
            if seen is None or seen[0] != other:
                if seen is None and on_wait:
                    on_wait()
                seen = (other, now)
            elif now - seen[1] > self._expiry(body):
                self.files.delete_object(self.key, if_match=other)  # its holder is gone
                seen = None
            time.sleep(self._poll)

    def _start_renewing(self) -> None:
        self._thread = threading.Thread(target=self._renew, name=f"lease {self.key}", daemon=True)
        self._thread.start()

    def _renew_once(self) -> None:
        """One renewal; sets :attr:`lost` when the lease is gone or unrenewed for a lease time."""
        with self._mutex:
            if self.lost:
                return
            try:
                if self._shared:
                    self.etag = self.files.put_object(self.pin_key, self._body())
                    self._renewed_at = time.monotonic()
                    return
                etag = self.files.put_object(self.key, self._body(), if_match=self.etag)
            except Exception as exc:  # an outage: keep trying while the lease lasts
                if time.monotonic() - self._renewed_at > self.seconds:
                    self.lost = True
                    log.error(
                        "lock %s: not renewed for a lease time (%s); another run may have taken it, so this build "
                        "will not publish",
                        self.files.where(self.key),
                        scrub(str(exc)),
                    )
                else:
                    log.warning("lock %s: renewing failed (%s); retrying", self.files.where(self.key), scrub(str(exc)))
                return
            if etag is None:
                self.lost = True
                log.error(
                    "lock %s: another run took this lock over (this one did not renew it in time); this build "
                    "will not publish",
                    self.files.where(self.key),
                )
                return
            self.etag, self._renewed_at = etag, time.monotonic()

    def _renew(self) -> None:
        while not self._stop.wait(self.seconds / 3) and not self.lost:
            self._renew_once()

    def confirm(self) -> bool:
        """Renew now (a compare-and-swap): whether this process still holds the lease."""
        self._renew_once()
        return not self.lost

    def holds(self) -> bool:
        """Whether the lease is still ours: the renewals' verdict, renewed now only when they stalled for a lease
        time (a process stopped and resumed acts before its renewal thread has run)."""
        if not self.lost and time.monotonic() - self._renewed_at > self.seconds:
            self._renew_once()
        return not self.lost

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with contextlib.suppress(Exception):
            if self._shared:
                self.files.delete_object(self.pin_key)
            elif not self.lost and self.etag is not None:
                self.files.delete_object(self.key, if_match=self.etag)
