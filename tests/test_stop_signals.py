"""A signal during training checkpoints the step it arrived in; the resumed run is bit-exact."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from attnlens.training.stop_signals import StopSignals, TrainingStopped
from attnlens.training.train_state import LATEST_FILE
from attnlens.training.trainer import TrainConfig, fit
from tests.test_trainer import run, sample, tiny

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals")


@pytest.fixture(autouse=True)
def live_signals():
    """The signals with their usual handlers, whatever this test process inherited: under
    nohup (as CI may run) SIGHUP is ignored, in a shell's background job SIGINT, and
    StopSignals rightly leaves an ignored signal ignored."""
    usual = {signal.SIGTERM: signal.SIG_DFL, signal.SIGHUP: signal.SIG_DFL,
             signal.SIGINT: signal.default_int_handler}
    before = {sig: signal.signal(sig, handler) for sig, handler in usual.items()}
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)


def config():
    return TrainConfig(steps=8, batch_size=4, lr=3e-3, warmup=2, progress=False,
                       checkpoint_every=3)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_checkpoints_its_step_and_the_resumed_run_is_bit_exact(tmp_path, signum):
    full_model, full = run(tmp_path / "full", steps=8, checkpoint_every=3)
    calls = {"n": 0}

    def signalled_sample(batch, gen):
        calls["n"] += 1
        if calls["n"] == 5:   # arrives while step 5 is being prepared
            os.kill(os.getpid(), signum)
        return sample(batch, gen)

    cut = tmp_path / "cut"
    before = signal.getsignal(signum)
    with pytest.raises(TrainingStopped, match=rf"{signal.Signals(signum).name} after step 5;"
                       r" checkpoint saved in .*step-0000005.*run the same command again") as err:
        fit(tiny(), signalled_sample, config(), run_dir=cut, evaluate=lambda m: {"val_loss": 1.0})
    assert err.value.step == 5 and err.value.signum == signum
    assert isinstance(err.value, KeyboardInterrupt)   # `except Exception` does not swallow it
    assert signal.getsignal(signum) is before          # the caller's handler is back
    assert (cut / LATEST_FILE).read_text() == "step-0000005"   # not the step-3 checkpoint
    resumed_model = tiny()
    resumed = fit(resumed_model, sample, config(), run_dir=cut,
                  evaluate=lambda m: {"val_loss": 1.0})
    assert resumed == full[5:]
    for name, a in full_model.state_dict().items():
        assert torch.equal(a, resumed_model.state_dict()[name]), name


def test_a_signal_during_the_last_step_still_stops_the_caller_after_saving(tmp_path):
    calls = {"n": 0}

    def signalled_sample(batch, gen):
        calls["n"] += 1
        if calls["n"] == 8:
            os.kill(os.getpid(), signal.SIGTERM)
        return sample(batch, gen)

    with pytest.raises(TrainingStopped, match="after step 8"):
        fit(tiny(), signalled_sample, config(), run_dir=tmp_path)
    assert (tmp_path / LATEST_FILE).read_text() == "step-0000008"
    assert fit(tiny(), sample, config(), run_dir=tmp_path) == []   # finished: nothing left


def test_without_a_run_directory_signals_keep_their_usual_meaning(tmp_path):
    def interrupted_sample(batch, gen):
        os.kill(os.getpid(), signal.SIGINT)
        return sample(batch, gen)

    with pytest.raises(KeyboardInterrupt) as err:   # nowhere to save: Ctrl-C stops at once
        fit(tiny(), interrupted_sample, config().__class__(steps=3, progress=False))
    assert not isinstance(err.value, TrainingStopped)


def test_a_second_ctrl_c_stops_at_once_and_ignored_signals_stay_ignored():
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)   # as under nohup
    try:
        with StopSignals() as stop:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            assert stop.received == signal.SIGINT
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_a_terminated_training_process_leaves_a_checkpoint_of_its_last_step(tmp_path):
    """The real thing: another process, SIGTERM from outside, exit status and message."""
    script = textwrap.dedent(f"""
        import signal, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_DFL)   # whatever the parent inherited
        from attnlens.training.trainer import TrainConfig, fit
        from tests.test_trainer import sample, tiny
        def slow_sample(batch, gen):
            slow_sample.n += 1
            if slow_sample.n == 3:   # two steps done: the parent may signal
                print("ready", flush=True)
            time.sleep(0.2)
            return sample(batch, gen)
        slow_sample.n = 0
        fit(tiny(), slow_sample, TrainConfig(steps=1000, batch_size=4, progress=False),
            run_dir={str(tmp_path)!r})
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(__file__)))
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "TrainingStopped: stopped by SIGTERM after step" in stderr
    step = int((tmp_path / LATEST_FILE).read_text().split("-")[1])
    assert 2 <= step < 1000
