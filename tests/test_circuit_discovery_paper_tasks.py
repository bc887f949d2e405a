"""Circuit discovery on the zoo's paper-task models
(attnlens.interp.circuits.discovery.paper_tasks).

The thresholds are what was measured on the shipped checkpoints, with margin
(docs/circuit_discovery.md, "Find the block and conjunction"):

- find the block (`mta-findblock-last-mta-s0`, 16 prompts, seed 0): metric -0.001 clean vs
  about -7 corrupted; the top-10 EAP-IG circuit has faithfulness 1.00. The MTA models of this
  task are trained with the paper's key-query convolution only (no head mixing), so their graph
  has no within-layer edge: the convolution is inside the head node.
- conjunction (`dcmha-conjunction-dcmha-s0`, 16 prompts, seed 0, value corruption): the
  top-20 EAP-IG circuit (5 steps) has faithfulness 0.97 and 9 Compose edges. Corrupting one
  conjoined attribute moves the metric by less than 0.01 nats: the shipped models ignore the
  attributes.
"""

from __future__ import annotations

import pytest
import torch

from attnlens.hooked_models import zoo
from attnlens.interp.circuits.discovery import discover
from attnlens.interp.circuits.discovery.extract import circuit_metric, reference_record
from attnlens.interp.circuits.discovery.paper_tasks import (
    conjunction_task_pair,
    find_block_task,
    model_variant,
)
from attnlens.interp.tasks.find_block import CPU_TASK, FindBlockTask


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def findblock():
    return zoo.load("mta-findblock-last-mta-s0")


@pytest.fixture(scope="module")
def conjunction():
    return zoo.load("dcmha-conjunction-dcmha-s0")


def test_find_block_pairs_corrupt_only_the_target_block(findblock):
    assert model_variant(findblock) == "Last"
    task = find_block_task(findblock, n_prompts=16, seed=0)
    assert task.clean.shape == task.corrupted.shape == (16, findblock.cfg.n_ctx)
    gen = FindBlockTask(**CPU_TASK, variant="Last")
    tok = gen.tokenizer()
    for row, s in enumerate(gen.generate(16, seed=0)):
        start = 1 + sum(len(b) + 1 for b in s.blocks[:s.target_index])
        diff = (task.clean[row] != task.corrupted[row]).nonzero().flatten().tolist()
        assert diff and set(diff) <= set(range(start, start + gen.block_length))
        text = tok.decode(task.corrupted[row, 1:1 + gen.prompt_length].tolist())
        blocks = text.split("#")[0].split(".")
        assert not any(set(s.query) <= set(b) for b in blocks)    # no block matches the query
    with torch.no_grad():
        clean = float(task.metric(findblock(task.clean)))
        corrupted = float(task.metric(findblock(task.corrupted)))
    assert clean > -0.05 and corrupted < -4            # measured -0.001 and about -7
    with pytest.raises(ValueError, match="variant"):
        model_variant(zoo.load("induction-mha"))


@pytest.mark.parametrize("corrupt", ["attribute", "value"])
def test_conjunction_pairs_change_one_token_of_the_target_record(conjunction, corrupt):
    task = conjunction_task_pair(conjunction, n_prompts=16, seed=0, corrupt=corrupt)
    assert task.clean.shape == task.corrupted.shape == (16, 23)
    diff = task.clean != task.corrupted
    assert (diff.sum(1) == 1).all()
    rec = task.corrupted[:, 1:19].view(16, 6, 3)
    colour, shape, answer = task.corrupted[:, -3], task.corrupted[:, -2], task.corrupted[:, -1]
    both = (rec[..., 0] == colour[:, None]) & (rec[..., 1] == shape[:, None])
    if corrupt == "attribute":
        assert not both.any()                          # no record has both attributes
        assert (diff[:, 1:19].view(16, 6, 3)[..., 2] == 0).all()
    else:
        assert (both.sum(1) == 1).all()
        assert not (rec[..., 2] == answer[:, None]).any()   # the answer is nowhere in context
    with torch.no_grad():
        change = float(task.metric(conjunction(task.corrupted))
                       - task.metric(conjunction(task.clean)))
    if corrupt == "value":
        assert change < -1.0                           # measured -1.7 (32 prompts)
    else:
        assert abs(change) < 0.05                      # the shipped models ignore attributes
    with pytest.raises(ValueError, match="corrupt"):
        conjunction_task_pair(conjunction, 4, corrupt="colour")


def test_find_block_circuit_is_faithful_without_within_layer_edges(findblock):
    found = discover(findblock, find_block_task(findblock, 16, seed=0), "eap-ig", steps=5,
                     top_k=10)
    assert found.faithfulness["faithfulness"] > 0.95   # measured 1.00
    assert found.graph.summary()["mix_edges"] == 0     # key-query convolution only
    assert "L0H1->logits" in {e.name for e in found.circuit}


def test_conjunction_circuit_holds_compose_edges(conjunction):
    task = conjunction_task_pair(conjunction, 16, seed=0, corrupt="value")
    found = discover(conjunction, task, "eap-ig", steps=5, top_k=20)
    faith = found.faithfulness
    assert faith["faithfulness"] > 0.8                 # measured 0.97
    mix = [e for e in found.circuit if e.kind == "mix"]
    assert len(mix) >= 3                               # measured 9
    ref = reference_record(conjunction, found.graph, task.corrupted)
    without = circuit_metric(conjunction, found.graph,
                             [e for e in found.circuit if e.kind != "mix"], task.clean,
                             task.metric, ref)
    assert without < faith["circuit"]                  # the Compose edges carry part of it


def _gap(model, corrupt: str, **kwargs) -> float:
    task = conjunction_task_pair(model, 32, seed=0, corrupt=corrupt, **kwargs)
    with torch.no_grad():
        return float(task.metric(model(task.clean)) - task.metric(model(task.corrupted)))


def test_full_dcmha_names_the_target_by_its_unique_value():
    """Issue 24/25: trained to early stopping at lr 1e-3 the DCMHA passes the 1/3 ceiling
    (accuracy 0.63), yet replacing one of the target's attributes, so that no record has both,
    moves the target's log-prob by 0.02 nats, while removing its value costs 8: on the plain
    lookups it points at the value written once, and on twin prompts (every value written
    twice) it is below chance (docs/circuit_discovery.md)."""
    model = zoo.load("dcmha-conjunction-full-dcmha-s0")
    assert abs(_gap(model, "attribute")) < 0.1        # measured 0.024
    assert _gap(model, "value") > 5.0                 # measured 8.0
    m = model.card["metrics"]
    assert m["accuracy"] > 0.5 and m["acc_twin"] < 1 / 3


def test_twin_models_read_the_value_and_not_the_conjunction():
    """On twin lookups neither variant passes the 1/3 ceiling; the attribute corruption does
    not move them and the value corruption is carried by a circuit without Compose edges."""
    for name in ("dcmha-conjunction-twin-dcmha-s0", "dcmha-conjunction-twin-mha-s0"):
        model = zoo.load(name)
        assert model.card["metrics"]["accuracy"] < 0.4   # measured 0.35 / 0.34
        assert abs(_gap(model, "attribute", twin_target=True)) < 0.05
        assert _gap(model, "value", twin_target=True) > 0.5
