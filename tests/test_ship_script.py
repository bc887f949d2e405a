"""scripts/ship_text_models.sh: the text zoo's ship flow, checked with DRY_RUN=1 (nothing runs,
nothing is copied) on a fake release directory."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ship_text_models.sh"


def _ship(out: Path, *names: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(out), "DRY_RUN": "1"}
    return subprocess.run(["bash", str(SCRIPT), *names], env=env, capture_output=True,
                          text=True, timeout=60)


def _release(out: Path, name: str) -> None:
    (out / "release" / name).mkdir(parents=True)
    (out / "release" / name / "card.json").write_text("{}")


def test_dry_run_ships_every_unshipped_release_through_each_step(tmp_path):
    _release(tmp_path, "text-test-l9")
    _release(tmp_path, "text-mha-l2")          # shipped already: not picked up
    (tmp_path / "release" / "text-half-l9").mkdir()   # no card: not finished
    done = _ship(tmp_path)
    assert done.returncode == 0, done.stderr
    commands = [ln[2:] for ln in done.stderr.splitlines() if ln.startswith("+ ")]
    assert commands[0] == (f"cp -r {tmp_path}/release/text-test-l9 "
                           "hooked_models/zoo/text-test-l9")
    assert "attnlens.lab.calibration " + str(tmp_path / "runs" / "text-test-l9") in commands[1]
    assert commands[2].endswith("-m attnlens.lab.text_studies hooked_models/zoo --only "
                                "text-test-l9")
    assert commands[3].endswith("-m attnlens.reports.zoo_docs")
    assert "--execute 01_quickstart 02_induction_heads" in commands[4]
    assert not (SCRIPT.parents[1] / "hooked_models" / "zoo" / "text-test-l9").exists()


def test_nothing_to_ship_is_said_and_bad_names_are_refused(tmp_path):
    (tmp_path / "release").mkdir()
    nothing = _ship(tmp_path)
    assert nothing.returncode == 0 and "no released run" in nothing.stderr
    missing = _ship(tmp_path, "text-mta-l4mlp")
    assert missing.returncode == 2 and "has no finished release" in missing.stderr
    _release(tmp_path, "text-mha-l2")
    shipped = _ship(tmp_path, "text-mha-l2")
    assert shipped.returncode == 2 and "exists; remove it first" in shipped.stderr
    assert "+ cp" not in missing.stderr + shipped.stderr
