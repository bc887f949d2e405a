"""Issue 24 item 5: the larger-budget paper-task models replace the 1000-step ones where they
score better. The old ones stay bundled as the report's baselines, marked: the zoo's table is
the one the cards give, loading one warns and names its replacements, listings put them last
or leave them out."""

from __future__ import annotations

import copy
import json
import warnings

import pytest

from attnlens.hooked_models import zoo
from attnlens.lab.paper import superseded
from attnlens.reports.reproduction import page as report

CARDS = report.shipped_cards()
TABLE = json.loads((zoo.ZOO_DIR / zoo.SUPERSEDED_FILE).read_text())


def test_the_zoos_table_is_the_one_the_cards_give():
    assert TABLE == superseded.superseded(CARDS), (
        "hooked_models/zoo/superseded.json is stale: run python -m attnlens.lab.paper report")
    assert set(TABLE) <= set(CARDS) and all(set(t["by"]) <= set(CARDS) for t in TABLE.values())


def _pair(old_metrics, new_metrics):
    cards = {}
    for name, metrics in (("cope-flipflop-rope-s0", old_metrics),
                          ("cope-flipflop-rope-long-s0", new_metrics)):
        cards[name] = {"recipe": name, "metrics": metrics}
    return cards


def test_a_replacement_counts_only_where_it_scores_better_on_the_common_splits():
    better = superseded.superseded(_pair({"error_id": 0.2, "error_long_2x": 0.4},
                                         {"error_id": 0.1, "error_long_2x": 0.3,
                                          "error_sparse": 0.9}))
    entry = better["cope-flipflop-rope-s0"]
    assert entry["by"] == ["cope-flipflop-rope-long-s0"] and entry["seeds"] == [1, 1]
    assert entry["old"] == pytest.approx(0.3) and entry["new"] == pytest.approx(0.2)
    assert "error_sparse" not in entry["score"]          # only what both cards report
    worse = _pair({"error_id": 0.1}, {"error_id": 0.2})
    assert superseded.superseded(worse) == {}
    text = report.superseded_section(superseded.comparisons(worse))
    assert text.startswith("No model is superseded yet.")
    assert "Not superseded" in text and "| `cope-flipflop-rope-s0` |" in text
    assert "| 10.0% (n=1) | 20.0% (n=1) |" in text
    assert superseded.superseded(_pair({"error_id": 0.1}, {"error_id": 0.1})) == {}
    with pytest.raises(ValueError, match="no common mean error metric"):
        superseded.superseded(_pair({"error_id": 0.1}, {"error_x": 0.0}))


def test_accuracy_settings_compare_each_sides_seed_mean():
    cards = {f"dcmha-conjunction-mha-s{s}": {"metrics": {"accuracy": a}}
             for s, a in enumerate([0.2, 0.3, 0.4])}
    cards |= {f"dcmha-conjunction-full-mha-s{s}": {"metrics": {"accuracy": a}}
              for s, a in enumerate([0.3, 0.4])}
    table = superseded.superseded(copy.deepcopy(cards))
    assert sorted(table) == [f"dcmha-conjunction-mha-s{s}" for s in range(3)]
    assert table["dcmha-conjunction-mha-s1"]["old"] == pytest.approx(0.3)
    assert table["dcmha-conjunction-mha-s1"]["new"] == pytest.approx(0.35)
    cards["dcmha-conjunction-full-mha-s1"]["metrics"]["accuracy"] = 0.29
    assert superseded.superseded(cards) == {}             # 0.295 < 0.3: not better


def test_loading_a_superseded_model_warns_and_names_its_replacements():
    if not TABLE:
        pytest.skip("no model is superseded")
    name = sorted(TABLE)[0]
    with pytest.warns(zoo.SupersededModelWarning, match=TABLE[name]["by"][0]):
        model = zoo.load(name)
    assert model.card["recipe"] == name                  # still loads as asked
    current = TABLE[name]["by"][0]
    assert zoo.superseded_by(current) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error", zoo.SupersededModelWarning)
        zoo.load(current)


def test_listings_leave_out_or_mark_the_superseded_models(capsys):
    from attnlens.lab.paper.__main__ import main

    every, current = zoo.available(kind="paper-task"), zoo.available("paper-task",
                                                                     superseded=False)
    assert sorted(set(every) - set(current)) == sorted(TABLE)
    if not TABLE:
        return
    name = sorted(TABLE)[0]
    main(["list", name])
    line = capsys.readouterr().out
    stem = TABLE[name]["by"][0].rsplit("-s", 1)[0]
    assert "shipped; superseded by " + stem in line


def test_serve_lists_a_zoos_superseded_models_last(monkeypatch, capsys):
    import attnlens.cli as cli
    import attnlens.dashboards.app

    seen = {}

    class Store:
        def __init__(self, sources):
            seen["sources"] = sources
            self.names = list(sources)

    class App:
        def run(self, **kwargs):
            seen["run"] = kwargs

    monkeypatch.setattr(cli, "build_store", Store)
    monkeypatch.setattr(cli, "check_port", lambda host, port: None)
    monkeypatch.setattr(attnlens.dashboards.app, "create_app", lambda store, host: App())
    assert cli.main(["serve", "--zoo", "paper"]) == 0
    sources = seen["sources"]
    assert sorted(sources) == sorted(zoo.available(kind="paper-task"))
    n = len(sources) - len(TABLE)
    assert sorted(sources[n:]) == sorted(TABLE) and not set(sources[:n]) & set(TABLE)
    if TABLE:
        assert f"{len(TABLE)} superseded model(s)" in capsys.readouterr().err
