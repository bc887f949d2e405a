"""attnlens.interp.plots.png.write_png: a PNG export that cannot hang (kaleido's Chromium sometimes
never starts). Fake drawing children stand in for kaleido: one that hangs, with a grandchild in a
session of its own as Chromium is; one that hangs once and then draws; one that fails."""

from __future__ import annotations

import json
import os
import struct
import sys
import time

import plotly.graph_objects as go
import pytest

from attnlens.interp.plots import png
from attnlens.interp.plots.png import PngError, PngTimeout, write_png, write_pngs

FIG = go.Figure(go.Bar(y=[1, 3, 2]))

# Each fake child gets argv: path, width, height (as the real one does).
HANGS_WITH_BROWSER = [sys.executable, "-c", (
    "import subprocess, sys, time\n"
    "browser = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],\n"
    "                           start_new_session=True)\n"
    "with open(sys.argv[1] + '.pids', 'a') as f:\n"
    "    f.write(f'{browser.pid}\\n')\n"
    "time.sleep(600)\n")]
HANGS_ONCE = [sys.executable, "-c", (
    "import os, sys, time\n"
    "tries = sys.argv[1] + '.tries'\n"
    "first = not os.path.exists(tries)\n"
    "open(tries, 'a').write('x')\n"
    "if first:\n"
    "    time.sleep(600)\n"
    "open(sys.argv[1], 'wb').write(sys.stdin.buffer.read())\n")]
FAILS = [sys.executable, "-c", (
    "import sys\n"
    "open(sys.argv[1] + '.tries', 'a').write('x')\n"
    "sys.exit('ValueError: Invalid value of type builtins.str received for the width')\n")]

# The batch child gets the figures on stdin as a JSON list of {fig, path, width, height}.
DRAWS_MANY = [sys.executable, "-c", (
    "import json, sys\n"
    "jobs = json.loads(sys.stdin.read())\n"
    "open(jobs[0]['path'] + '.children', 'a').write('x')\n"
    "for j in jobs:\n"
    "    open(j['path'], 'w').write(json.dumps([j['fig'], j['width'], j['height']]))\n")]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="the browser check reads /proc")
def test_a_hanging_draw_times_out_on_every_try_and_leaves_no_browser(tmp_path):
    path = tmp_path / "fig.png"
    start = time.monotonic()
    with pytest.raises(PngTimeout, match=r"fig\.png.*within 1 s, 2 tries"):
        write_png(FIG, path, timeout=1, tries=2, command=HANGS_WITH_BROWSER)
    assert time.monotonic() - start < 30
    pids = [int(p) for p in (tmp_path / "fig.png.pids").read_text().split()]
    assert len(pids) == 2                                   # one fresh child per try
    deadline = time.monotonic() + 5
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(_alive, pids)), "a browser of a killed try is still running"
    assert not path.exists()


def test_a_draw_that_hangs_once_is_drawn_by_the_second_try(tmp_path):
    path = tmp_path / "fig.png"
    assert write_png(FIG, path, timeout=1, tries=2, command=HANGS_ONCE) == path
    assert (tmp_path / "fig.png.tries").read_text() == "xx"
    assert path.read_bytes() == FIG.to_json().encode()      # the figure reached the child


def test_a_failing_draw_raises_kaleidos_message_without_retrying(tmp_path):
    path = tmp_path / "fig.png"
    with pytest.raises(PngError, match="Invalid value of type builtins.str") as error:
        write_png(FIG, path, timeout=30, tries=3, command=FAILS)
    assert not isinstance(error.value, PngTimeout)
    assert (tmp_path / "fig.png.tries").read_text() == "x"


def test_write_pngs_draws_every_figure_in_one_child(tmp_path):
    figs = [FIG, go.Figure(go.Scatter(y=[2, 1]))]
    paths = [tmp_path / "a.png", tmp_path / "b.png"]
    jobs = [(figs[0], paths[0], 320, 200), (figs[1], paths[1], None, None)]
    assert write_pngs(jobs, command=DRAWS_MANY) == paths
    assert (tmp_path / "a.png.children").read_text() == "x"      # one child, one browser
    assert json.loads(paths[0].read_text()) == [figs[0].to_json(), 320, 200]
    assert json.loads(paths[1].read_text()) == [figs[1].to_json(), None, None]
    assert write_pngs([], command=FAILS) == []                     # nothing to draw: no child


def test_write_pngs_names_the_batch_in_its_errors(tmp_path):
    jobs = [(FIG, tmp_path / "a.png", None, None), (FIG, tmp_path / "b.png", None, None)]
    fails = [sys.executable, "-c", "import sys; sys.exit('ValueError: Invalid value')"]
    with pytest.raises(PngError, match=r"2 figures .*a\.png.*Invalid value") as error:
        write_pngs(jobs, timeout=30, tries=3, command=fails)
    assert not isinstance(error.value, PngTimeout)   # time limits: write_png's tests (_draw)


def test_save_pngs_draws_one_by_one_when_kaleido_rejects_the_batch(tmp_path, monkeypatch):
    from attnlens.interp.plots import analyses

    def batch_fails(jobs, **_):
        raise PngError("could not draw 2 figures: Invalid value")

    def one(fig, path, **_):
        if fig is FIG:
            raise PngError(f"could not draw {str(path)!r}: Invalid value")
        path.write_bytes(b"png")
        return path

    monkeypatch.setattr(analyses, "kaleido_available", lambda: True)
    monkeypatch.setattr(png, "write_pngs", batch_fails)
    monkeypatch.setattr(png, "write_png", one)
    other = go.Figure(go.Scatter(y=[2, 1]))
    with pytest.warns(UserWarning, match=r"a\.png.*a\.html is written"):
        written = analyses.save_pngs([(FIG, tmp_path / "a"), (other, tmp_path / "b")])
    assert written == [tmp_path / "b.png"]


@pytest.mark.parametrize("tries, timeout", [(0, 1.0), (1, 0.0)])
def test_bad_limits_are_refused(tmp_path, tries, timeout):
    with pytest.raises(ValueError, match="tries >= 1 and timeout > 0"):
        write_png(FIG, tmp_path / "x.png", tries=tries, timeout=timeout)


def test_save_figure_keeps_the_html_and_warns_when_the_png_fails(tmp_path, monkeypatch):
    from attnlens.interp.plots import analyses

    def fails(fig, path, **_):
        raise PngTimeout(f"could not draw {str(path)!r}: did not finish")

    monkeypatch.setattr(analyses, "kaleido_available", lambda: True)
    monkeypatch.setattr(png, "write_png", fails)
    with pytest.warns(UserWarning, match=r"could not draw .*fig\.png.*fig\.html is written"):
        written = analyses.save_figure(FIG, tmp_path / "fig", plotlyjs="cdn")
    assert written == [tmp_path / "fig.html"] and written[0].is_file()


def test_real_kaleido_draws_at_the_asked_size(tmp_path):
    from attnlens.interp.plots.analyses import kaleido_available

    if not kaleido_available():
        pytest.skip("kaleido is not installed (the `report` extra)")
    path = tmp_path / "fig.png"
    try:
        write_png(FIG, path, width=320, height=200)
    except PngError as error:         # kaleido without a browser on this machine
        pytest.skip(str(error))
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", head[16:24]) == (320, 200)
