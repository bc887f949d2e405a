"""PNG export of plotly figures that cannot hang.

kaleido 1.x draws a PNG by starting headless Chromium. Now and then that start never completes:
`fig.write_image` then waits forever (kaleido's own 90 s limit covers the drawing, not the
browser's start), and so does whatever called it. On 2026-11-29 it held
`python -m attnlens.lab.text_studies` for 14 minutes until killed; the same call then took 25 s.

`write_png` draws in a child process with a time limit. A child past the limit is killed with
the browser it started, and the figure is drawn again in a fresh one, up to `tries` times; if
every try runs out of time, `PngTimeout` says so. A figure kaleido rejects raises at once
(`PngError`, with kaleido's message), as `write_image` would.

    from attnlens.interp.plots.png import write_png
    write_png(fig, "docs/figures/x.png", width=800, height=420)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

TIMEOUT_S = 120.0   # a PNG of ours draws in 2-10 s on a 2-core CPU; Chromium's start is most of it
TRIES = 2

# The child: read the figure's JSON from stdin, write the PNG.
_DRAW = (
    "import sys\n"
    "import plotly.io as pio\n"
    "fig = pio.from_json(sys.stdin.read(), skip_invalid=False)\n"
    "path, width, height = sys.argv[1], sys.argv[2], sys.argv[3]\n"
    "fig.write_image(path, width=int(width) if width else None,\n"
    "                height=int(height) if height else None)\n"
)


class PngError(RuntimeError):
    """kaleido could not draw the figure (its message is part of this error's)."""


class PngTimeout(PngError):
    """Every try to draw the figure ran past the time limit."""


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc; [] elsewhere). Chromium runs in a session of
    its own, so killing the child's process group would leave it running."""
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:          # gone since the listing
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill_tree(process: subprocess.Popen) -> None:
    for pid in [*_descendants(process.pid), process.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    process.wait()


def write_png(fig, path: str | Path, width: int | None = None, height: int | None = None,
              timeout: float = TIMEOUT_S, tries: int = TRIES,
              command: list[str] | None = None) -> Path:
    """Write `fig` (a plotly figure) as the PNG `path`, at `width` x `height` pixels (the
    figure's layout size where None), each try within `timeout` seconds; returns the path.

    `command` replaces the drawing child (tests). Raises `PngTimeout` when every one of the
    `tries` ran out of time, `PngError` when kaleido fails (e.g. it is not installed)."""
    if tries < 1 or timeout <= 0:
        raise ValueError(f"write_png needs tries >= 1 and timeout > 0, got {tries}, {timeout}")
    path = Path(path)
    spec = fig.to_json().encode()
    argv = command or [sys.executable, "-c", _DRAW]
    argv = [*argv, str(path), str(width or ""), str(height or "")]
    for _ in range(tries):
        child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE)
        try:
            _, err = child.communicate(spec, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(child)
            continue
        if child.returncode != 0:
            message = err.decode(errors="replace").strip().splitlines()
            raise PngError(f"could not draw {str(path)!r}: "
                           + (message[-1] if message else f"exit status {child.returncode}"))
        return path
    raise PngTimeout(f"could not draw {str(path)!r}: kaleido (headless Chromium) did not finish "
                     f"within {timeout:.0f} s, {tries} tries; the figure's other files are kept")


__all__ = ["PngError", "PngTimeout", "TIMEOUT_S", "write_png"]
