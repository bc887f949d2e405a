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

`write_pngs` draws many figures in one child, so Chromium starts once for all of them: a start
is ~3-4 s of the ~4 s one small figure takes on a 2-core CPU (`attnlens analyze` writes 18).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

TIMEOUT_S = 120.0   # a PNG of ours draws in 2-10 s on a 2-core CPU; Chromium's start is most of it
PER_FIGURE_S = 10.0  # `write_pngs`' limit grows by this per figure beyond the first
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

# The batch child: read a JSON list of {fig, path, width, height}, draw them with one browser.
_DRAW_MANY = (
    "import json, sys\n"
    "import plotly.io as pio\n"
    "jobs = json.loads(sys.stdin.read())\n"
    "pio.write_images([pio.from_json(j['fig'], skip_invalid=False) for j in jobs],\n"
    "                 [j['path'] for j in jobs], width=[j['width'] for j in jobs],\n"
    "                 height=[j['height'] for j in jobs])\n"
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


def _draw(argv: list[str], spec: bytes, what: str, timeout: float, tries: int) -> None:
    """Run the drawing child `argv` with `spec` on stdin, each try within `timeout` seconds; a
    try past it is killed with its browser and the next starts fresh."""
    if tries < 1 or timeout <= 0:
        raise ValueError(f"write_png needs tries >= 1 and timeout > 0, got {tries}, {timeout}")
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
            raise PngError(f"could not draw {what}: "
                           + (message[-1] if message else f"exit status {child.returncode}"))
        return
    raise PngTimeout(f"could not draw {what}: kaleido (headless Chromium) did not finish "
                     f"within {timeout:.0f} s, {tries} tries; the figure's other files are kept")


def write_png(fig, path: str | Path, width: int | None = None, height: int | None = None,
              timeout: float = TIMEOUT_S, tries: int = TRIES,
              command: list[str] | None = None) -> Path:
    """Write `fig` (a plotly figure) as the PNG `path`, at `width` x `height` pixels (the
    figure's layout size where None), each try within `timeout` seconds; returns the path.

    `command` replaces the drawing child (tests). Raises `PngTimeout` when every one of the
    `tries` ran out of time, `PngError` when kaleido fails (e.g. it is not installed)."""
    path = Path(path)
    argv = [*(command or [sys.executable, "-c", _DRAW]), str(path), str(width or ""),
            str(height or "")]
    _draw(argv, fig.to_json().encode(), repr(str(path)), timeout, tries)
    return path


def write_pngs(jobs, timeout: float | None = None, tries: int = TRIES,
               command: list[str] | None = None) -> list[Path]:
    """`write_png` for many figures in one child (one Chromium start): `jobs` are
    `(fig, path, width, height)` tuples (width/height None: the layout's size). A try's limit
    is `timeout`, by default `TIMEOUT_S` plus `PER_FIGURE_S` per further figure. Returns the
    paths; raises as `write_png` does (a figure kaleido rejects fails the batch: draw the
    figures one by one with `write_png` to keep the others)."""
    jobs = [(fig, Path(path), width, height) for fig, path, width, height in jobs]
    if not jobs:
        return []
    if timeout is None:
        timeout = TIMEOUT_S + PER_FIGURE_S * (len(jobs) - 1)
    spec = json.dumps([{"fig": fig.to_json(), "path": str(path), "width": width,
                        "height": height} for fig, path, width, height in jobs]).encode()
    what = (repr(str(jobs[0][1])) if len(jobs) == 1
            else f"{len(jobs)} figures ({str(jobs[0][1])!r}, ...)")
    _draw(command or [sys.executable, "-c", _DRAW_MANY], spec, what, timeout, tries)
    return [path for _, path, _, _ in jobs]


__all__ = ["PngError", "PngTimeout", "TIMEOUT_S", "write_png", "write_pngs"]
