"""A small background job queue for the dashboard: long computations (an attribution graph of a
long prompt takes minutes) run one at a time in a worker thread, with progress, a cancel and a
bounded queue, so a request never blocks the server and never piles up work.

Dash's background callbacks need diskcache and a process pool, neither a dependency here; this
queue is the equivalent the graph page uses (`attnlens.dashboards.pages.graph`): a callback
submits a job under a key (the same key is the same job), polls its state from a
`dcc.Interval`, and cancels it from a button. A job's function takes a `progress(done, total)`
callback; once the job is cancelled that callback raises `Cancelled`, which stops the work at
its next step. Errors become the job's message (the server stays up): ValueError's text as it
is, MemoryError and anything else with its type named.

Example:
    >>> jobs = JobRunner()
    >>> job = jobs.submit("square", lambda progress: 7 * 7)
    >>> jobs.wait("square", timeout=5).result
    49
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

QUEUED, RUNNING, DONE, FAILED, CANCELLED = "queued", "running", "done", "failed", "cancelled"
FINISHED = (DONE, FAILED, CANCELLED)


class Cancelled(Exception):
    """Raised by a cancelled job's progress callback, to stop the job's work."""


class Busy(ValueError):
    """The queue is full: a request gets this message instead of waiting without end."""


@dataclass
class Job:
    """One job: its key, function, state (queued, running, done, failed, cancelled), progress
    (`done` of `total` steps), result or error message, and times."""

    key: object
    fn: object
    state: str = QUEUED
    done: int = 0
    total: int = 0
    result: object = None
    error: str = ""
    submitted: float = field(default_factory=time.monotonic)
    started: float | None = None
    finished: float | None = None
    cancel_event: threading.Event = field(default_factory=threading.Event)

    def progress(self, done: int, total: int) -> None:
        """The callback handed to the job's function: records progress, stops a cancelled job."""
        self.done, self.total = int(done), int(total)
        if self.cancel_event.is_set():
            raise Cancelled()

    def describe(self) -> str:
        """A line for the page: the state with progress and elapsed time."""
        now = time.monotonic()
        if self.state == QUEUED:
            return "queued behind another graph"
        if self.state == RUNNING:
            share = f" {self.done} / {self.total} rows ({self.done / self.total:.0%})" \
                if self.total else ""
            return f"computing{share}, {now - (self.started or now):.0f} s"
        return self.state if self.state != FAILED else f"failed: {self.error}"


class JobRunner:
    """Jobs by key, run one at a time by a daemon worker thread (started on first use).

    `max_queued`: jobs waiting at most (one more is refused with `Busy`); `keep`: finished
    jobs kept (their results are what the page draws; older ones are dropped first)."""

    def __init__(self, max_queued: int = 4, keep: int = 3):
        self.max_queued, self.keep = max_queued, keep
        self._jobs: OrderedDict = OrderedDict()
        self._queue: deque = deque()
        self._cv = threading.Condition()
        self._worker: threading.Thread | None = None

    def get(self, key) -> Job | None:
        with self._cv:
            return self._jobs.get(key)

    def submit(self, key, fn) -> Job:
        """The job under `key`: the existing one unless it failed or was cancelled, else a new
        one queued to run `fn(progress)`. Busy when `max_queued` jobs already wait."""
        with self._cv:
            job = self._jobs.get(key)
            if job is not None and job.state not in (FAILED, CANCELLED):
                self._jobs.move_to_end(key)
                return job
            waiting = sum(1 for j in self._queue if j.state == QUEUED)
            if waiting >= self.max_queued:
                raise Busy(f"the server is busy: {waiting} graphs are waiting; try again when "
                           "they are done (or cancel one)")
            job = Job(key, fn)
            self._jobs[key] = job
            self._queue.append(job)
            self._trim()
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._work, name="dashboard-jobs",
                                                daemon=True)
                self._worker.start()
            self._cv.notify_all()
            return job

    def cancel(self, key) -> bool:
        """Cancel the job under `key` (a queued one never starts; a running one stops at its
        next progress step). False when there is no such unfinished job."""
        with self._cv:
            job = self._jobs.get(key)
            if job is None or job.state in FINISHED:
                return False
            job.cancel_event.set()
            if job.state == QUEUED:
                job.state, job.finished = CANCELLED, time.monotonic()
            self._cv.notify_all()
            return True

    def wait(self, key, timeout: float | None = None) -> Job | None:
        """The job under `key` once finished (or as it is when `timeout` runs out)."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while True:
                job = self._jobs.get(key)
                if job is None or job.state in FINISHED:
                    return job
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return job
                self._cv.wait(left)

    def _trim(self) -> None:
        finished = [k for k, j in self._jobs.items() if j.state in FINISHED]
        for k in finished[:max(0, len(finished) - self.keep)]:
            del self._jobs[k]

    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                job = self._queue.popleft()
                if job.state != QUEUED:
                    continue
                job.state, job.started = RUNNING, time.monotonic()
            state, result, error = DONE, None, ""
            try:
                result = job.fn(job.progress)
                if job.cancel_event.is_set():
                    state, result = CANCELLED, None
            except Cancelled:
                state = CANCELLED
            except ValueError as err:
                state, error = FAILED, str(err)
            except MemoryError:
                state, error = FAILED, "out of memory (lower the budget or shorten the prompt)"
            except Exception as err:     # the server stays up; the page shows what went wrong
                state, error = FAILED, f"{type(err).__name__}: {err}"
            with self._cv:
                job.state, job.result, job.error = state, result, error
                job.finished = time.monotonic()
                self._trim()
                self._cv.notify_all()


__all__ = ["Busy", "Cancelled", "Job", "JobRunner"]
