"""Stop a training run cleanly on SIGTERM, SIGHUP or Ctrl-C: finish the step, checkpoint, stop.

A run in the background dies with its session (SIGTERM or SIGHUP) and a run in a terminal is
stopped with Ctrl-C. Without this, everything since the last periodic checkpoint (minutes of
training) is lost. `fit` enters `StopSignals` while it trains: the first signal only sets a
flag, the loop saves a checkpoint at the end of the current step and raises `TrainingStopped`,
and running the same command again resumes from that step, bit for bit. A second Ctrl-C while
the step finishes stops at once (KeyboardInterrupt), as Ctrl-C usually does.

Handlers are installed only in the main thread (Python delivers signals there), never over a
signal that is ignored (`nohup` ignores SIGHUP, a shell's background job SIGINT: those stay
ignored), and restored on exit, so a notebook's or a server's own handlers are left as they were.
"""

from __future__ import annotations

import signal
import threading

SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP", "SIGINT") if hasattr(signal, n))


class TrainingStopped(KeyboardInterrupt):
    """A run stopped by a signal after saving its checkpoint; running it again resumes it.

    A KeyboardInterrupt, so `except Exception` handlers around a run do not swallow it and a
    queue of runs stops, as it would on a plain Ctrl-C.
    """

    def __init__(self, signum: int, step: int, checkpoint):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        where = f"checkpoint saved in {checkpoint}" if checkpoint else "no run directory to save in"
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step:,}; {where}"
                         + ("; run the same command again to resume" if checkpoint else ""))


class StopSignals:
    """Context manager: `received` is the first stop signal's number (None until one arrives)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt   # a second Ctrl-C: stop now, without the checkpoint
        if self.received is None:
            self.received = signum

    def __enter__(self) -> StopSignals:
        if self.enabled:
            for sig in SIGNALS:
                previous = signal.getsignal(sig)
                if previous is signal.SIG_IGN:
                    continue
                self._previous[sig] = signal.SIG_DFL if previous is None else previous
                signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
