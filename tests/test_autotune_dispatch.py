"""`LazyAutotune` runs a key's first launch through Triton's autotuner and later ones with the
config it chose straight from the kernel (Triton's dispatch costs ~19 us a launch on the host);
a new key, or a config with a pre-hook, goes through the autotuner again."""

import pytest
import torch

from attnlens.kernels import _triton

pytestmark = pytest.mark.skipif(not _triton.available(), reason="needs triton")


class FakeKernel:
    arg_names = ["X", "T_BUCKET", "n"]

    def __init__(self, log):
        self.log = log

    def __getitem__(self, grid):
        return lambda *args, **kw: self.log.append(("direct", args, kw))


def _tuner(monkeypatch, pre_hook=None):
    log = []
    config = _triton.triton.Config({"BLOCK_M": 64}, num_warps=4, num_stages=2,
                                   pre_hook=pre_hook)

    class FakeAutotuner:
        def __init__(self, kernel):
            self.best_config = None

        def __getitem__(self, grid):
            def run(*args, **kw):
                log.append(("tuned", args, kw))
                self.best_config = config
            return run

    monkeypatch.setattr(_triton, "gpu_arch", lambda: "sm_90")
    monkeypatch.setattr(_triton, "load_tuned", lambda: {})
    monkeypatch.setattr(_triton.triton, "autotune", lambda **kw: FakeAutotuner)
    tuner = _triton.LazyAutotune(FakeKernel(log), lambda: [config], ["T_BUCKET"], name="fake")
    _triton.LazyAutotune.instances.remove(tuner)
    return tuner, log


def test_later_launches_of_a_key_skip_the_autotuner(monkeypatch):
    tuner, log = _tuner(monkeypatch)
    x = torch.zeros(2)
    for _ in range(3):
        tuner[(1,)](x, 4096, 7, CAUSAL=True)
    assert [entry[0] for entry in log] == ["tuned", "direct", "direct"]
    want = {"CAUSAL": True, "BLOCK_M": 64, "num_warps": 4, "num_stages": 2}
    assert want.items() <= log[1][2].items() and log[1][1] == log[0][1]
    tuner[(1,)](x, 8192, 7, CAUSAL=True)               # a new key value
    tuner[(1,)](x, 4096, 7, CAUSAL=False)              # another constexpr
    tuner[(1,)](x.half(), 4096, 7, CAUSAL=True)        # another dtype
    assert [entry[0] for entry in log[3:]] == ["tuned", "tuned", "tuned"]


def test_a_config_with_a_pre_hook_always_goes_through_the_autotuner(monkeypatch):
    tuner, log = _tuner(monkeypatch, pre_hook=lambda nargs: None)
    for _ in range(2):
        tuner[(1,)](torch.zeros(2), 4096, 7)
    assert [entry[0] for entry in log] == ["tuned", "tuned"]


def test_a_tensor_keyword_keeps_the_autotuners_dispatch(monkeypatch):
    """A tensor passed by keyword would make every call a new key (and keep it alive)."""
    tuner, log = _tuner(monkeypatch)
    for _ in range(2):
        tuner[(1,)](torch.zeros(2), 4096, 7, Y=torch.zeros(1))
    assert [entry[0] for entry in log] == ["tuned", "tuned"] and not tuner._chosen
