"""The README's test command sets itself up: chromium is installed with apt when missing."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "ensure_browser.sh"


def fake_path(tmp_path, tools: dict[str, str]) -> str:
    """A PATH with the basic utilities plus stub `tools` (name -> shell body)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("bash", "id", "cat", "env", "true", "chmod", "printf"):
        os.symlink(shutil.which(name), bin_dir / name)
    for name, body in tools.items():
        stub = bin_dir / name
        stub.write_text(f"#!/bin/bash\n{body}\n")
        stub.chmod(0o755)
    return str(bin_dir)


def run(path: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True,
                          env={"PATH": path, **env}, timeout=60)


@pytest.mark.skipif(os.geteuid() != 0, reason="the apt branch runs as root here")
def test_missing_browser_is_installed_with_apt(tmp_path):
    log = tmp_path / "apt.log"
    bin_dir = tmp_path / "bin"
    # The stub apt-get records its arguments and "installs" both programs into the fake PATH.
    body = (f'echo "$@" >> {log}\n'
            f'if [ "$1" = install ] || [ "$3" = install ]; then\n'
            f'  printf "#!/bin/bash\\n" > {bin_dir}/chromium; chmod +x {bin_dir}/chromium\n'
            f'  printf "#!/bin/bash\\n" > {bin_dir}/chromedriver; chmod +x {bin_dir}/chromedriver\n'
            f'fi')
    out = run(fake_path(tmp_path, {"apt-get": body}))
    assert out.returncode == 0, out.stderr
    calls = log.read_text()
    assert "update" in calls and "install -y -qq chromium chromium-driver" in calls


def test_without_apt_it_says_what_to_do_and_fails(tmp_path):
    out = run(fake_path(tmp_path, {}))
    assert out.returncode == 1
    assert "apt-get install chromium chromium-driver" in out.stderr
    assert "ATTNLENS_SKIP_BROWSER=1" in out.stderr


def test_opting_out_passes_and_the_test_command_deselects_browser_tests(tmp_path):
    out = run(fake_path(tmp_path, {}), ATTNLENS_SKIP_BROWSER="1")
    assert out.returncode == 0
    test_sh = (ROOT / "scripts" / "test.sh").read_text()
    assert "bash scripts/ensure_browser.sh" in test_sh
    assert '-m "$tier and not reproduce and not install and not browser"' in test_sh
    assert '-m "$tier and not reproduce and not install"' in test_sh


def test_present_browser_needs_nothing(tmp_path):
    out = run(fake_path(tmp_path, {"chromium": "true", "chromedriver": "true",
                                   "apt-get": "exit 9"}))
    assert out.returncode == 0 and out.stderr == ""


def test_thread_count_follows_attnlens_test_threads():
    """conftest sets torch's thread count from ATTNLENS_TEST_THREADS (default 1) and refuses
    a value that is not a positive integer, naming it."""
    import torch

    assert torch.get_num_threads() == int(os.environ.get("ATTNLENS_TEST_THREADS", "1"))
    env = {**os.environ, "ATTNLENS_TEST_THREADS": "two"}
    run = subprocess.run([sys.executable, "-c", "import conftest"], cwd=ROOT / "tests", env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "ValueError: ATTNLENS_TEST_THREADS='two'" in run.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the apt branch runs as root here")
@pytest.mark.parametrize("script", ["scripts/ensure_browser.sh", ".ci/run"])
def test_apt_waits_for_a_dpkg_lock_held_by_another_process(tmp_path, script):
    """Issue 20 item 11: another apt process holds the lock; without DPkg::Lock::Timeout
    apt-get fails at once (as the stub does), with it apt-get waits and succeeds."""
    log, bin_dir = tmp_path / "apt.log", tmp_path / "bin"
    body = (f'echo "$@" >> {log}\n'
            'case "$*" in *"DPkg::Lock::Timeout=600"*) ;; *)\n'
            '  echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 7 '
            '(apt-get)" >&2; exit 100;; esac\n'
            f'if [ "$3" = install ]; then\n'
            f'  printf "#!/bin/bash\\n" > {bin_dir}/chromium; chmod +x {bin_dir}/chromium\n'
            f'  printf "#!/bin/bash\\n" > {bin_dir}/chromedriver; chmod +x {bin_dir}/chromedriver\n'
            f'fi')
    path = fake_path(tmp_path, {"apt-get": body, "make": "exit 0"})
    os.symlink(shutil.which("dirname"), bin_dir / "dirname")
    out = subprocess.run(["bash", str(ROOT / script)], capture_output=True, text=True,
                         env={"PATH": path}, timeout=60)
    assert out.returncode == 0, out.stderr
    calls = log.read_text().splitlines()
    assert [c.split()[2] for c in calls] == ["update", "install"], calls
