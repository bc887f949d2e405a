"""attnlens.lab.calibration: trajectories and the first evaluation that meets the zoo's bar."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from attnlens.lab.calibration import main, onset_table, trajectories


def write_log(run_dir, records):
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_onset_is_the_first_evaluation_meeting_both_bars(tmp_path, capsys):
    evals = [(250, 0.05, 0.99), (500, 0.35, 0.7), (750, 0.2, 0.4), (1000, 0.5, 0.3)]
    records = []
    for step, score, ratio in evals:
        records.append({"step": step - 1, "tokens": (step - 1) * 10, "train_loss": 5.0})
        records.append({"step": step, "tokens": step * 10, "train_loss": 4.0, "val_loss": 4.0,
                        "induction_score": score, "copy_loss_ratio": ratio,
                        "text_copy_ratio": ratio + 0.1})
    write_log(tmp_path / "a", records)
    write_log(tmp_path / "b", records[:4])
    traj = trajectories([tmp_path / "a", tmp_path / "b"])
    assert len(traj) == 6 and set(traj.run) == {"a", "b"}
    table = onset_table(traj).set_index("run")
    # step 500 has the score but not the ratio, step 750 the ratio but not the score
    assert table.loc["a", "induction_at_tokens"] == 10_000
    assert pd.isna(table.loc["b", "induction_at_tokens"])   # not met yet
    assert table.loc["b", "tokens_seen"] == 5000
    assert table.loc["a", "lowest_copy_loss_ratio"] == 0.3
    assert main([str(tmp_path / "a"), "--csv", str(tmp_path / "t.csv")]) == 0
    assert "10000" in capsys.readouterr().out and (tmp_path / "t.csv").is_file()


def test_a_directory_without_a_log_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty has no metrics.jsonl"):
        trajectories([tmp_path / "empty"])


def test_zoo_page_shows_the_calibration_table(tmp_path):
    from attnlens.reports.calibration_docs import calibration_section

    records = [{"step": 250, "tokens": 2_048_000, "val_loss": 4.5, "induction_score": 0.4,
                "copy_loss_ratio": 0.45, "text_copy_ratio": 0.6, "train_loss": 4.4}]
    write_log(tmp_path / "runs" / "text-mha-l2", records)
    trajectories([tmp_path / "runs" / "text-mha-l2"]).to_csv(tmp_path / "calibration.csv",
                                                             index=False)
    text = "\n".join(calibration_section(tmp_path, tmp_path / "zoo.md"))
    assert ("| `text-mha-l2` | l2, 16 x 256 for 6,250 steps then 8 x 512; lr decayed over the "
            "last 2,000 steps; natural text | 2.0M | 2.0M tokens | 0.400 | "
            "0.45 / 0.60 | 4.500 |") in text
    assert calibration_section(tmp_path / "nothing", tmp_path / "zoo.md") == []


def test_a_finished_run_without_the_bar_reads_not_met(tmp_path):
    from attnlens.reports.calibration_docs import calibration_section, run_budget_tokens

    assert run_budget_tokens("text-mha-l2") == 40_960_000
    assert run_budget_tokens("text-mha-l2-ctx256") == 40_960_000     # 10,000 x 16 x 256
    assert run_budget_tokens("text-infini-l2-v1") == 40_960_000      # 5,000 x 16 x 512
    assert run_budget_tokens("no-such-run") is None
    for run, tokens in (("text-mha-l1", 40_960_000), ("text-cope-l1", 2_048_000)):
        write_log(tmp_path / "runs" / run, [
            {"step": 250, "tokens": tokens, "val_loss": 4.5, "induction_score": 0.01,
             "copy_loss_ratio": 0.99, "text_copy_ratio": 0.98, "train_loss": 4.4}])
    trajectories([tmp_path / "runs" / r for r in ("text-mha-l1", "text-cope-l1")]).to_csv(
        tmp_path / "calibration.csv", index=False)
    rows = {line.split("|")[1].strip(): line.split("|")[4].strip()
            for line in calibration_section(tmp_path, tmp_path / "zoo.md")
            if line.startswith("| `")}
    assert rows == {"`text-mha-l1`": "not met", "`text-cope-l1`": "not yet"}


def test_keep_carries_earlier_runs_and_the_new_logs_win(tmp_path):
    """`--keep`: runs of an earlier CSV whose logs are gone stay; a run present in both is
    read from its log."""
    def evals(scale):
        return [{"step": s, "tokens": s * 10, "val_loss": 4.0, "induction_score": scale,
                 "copy_loss_ratio": 0.9, "text_copy_ratio": 0.95} for s in (250, 500)]

    write_log(tmp_path / "old", evals(0.01))
    write_log(tmp_path / "both", evals(0.02))
    earlier = tmp_path / "earlier.csv"
    trajectories([tmp_path / "old", tmp_path / "both"]).to_csv(earlier, index=False)
    (tmp_path / "both" / "metrics.jsonl").unlink()
    write_log(tmp_path / "new" / "both", evals(0.5))
    out = tmp_path / "t.csv"
    assert main([str(tmp_path / "new" / "both"), "--keep", str(earlier), "--csv", str(out)]) == 0
    traj = pd.read_csv(out)
    assert sorted(set(traj.run)) == ["both", "old"] and len(traj) == 4
    assert set(traj[traj.run == "both"].induction_score) == {0.5}
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="lacks"):
        main([str(tmp_path / "new" / "both"), "--keep", str(bad)])


def test_the_focus_figure_adds_the_validation_loss_and_names_unknown_runs(tmp_path):
    from attnlens.lab.calibration import figure

    records = [{"step": s, "tokens": s * 10, "val_loss": 4.0 - s / 1000, "induction_score": 0.1,
                "copy_loss_ratio": 0.9, "text_copy_ratio": 0.95} for s in (250, 500)]
    write_log(tmp_path / "a", records)
    traj = trajectories([tmp_path / "a"])
    fig = figure(traj, val_loss=True)
    assert len(fig.data) == 3 and list(fig.data[2].y) == [3.75, 3.5]
    assert len(figure(traj).data) == 2
    with pytest.raises(SystemExit, match="unknown: \\['zz'\\]"):
        main([str(tmp_path / "a"), "--focus", "zz", "--focus-png", str(tmp_path / "f.png")])


def test_zoo_models_and_calibration_runs_get_a_row_each_and_no_two_runs_look_alike(tmp_path):
    from attnlens.interp.plots.colors import VARIANT_COLOURS
    from attnlens.lab.calibration import figure, run_style

    records = [{"step": s, "tokens": s * 10, "val_loss": 4.0, "induction_score": 0.1,
                "copy_loss_ratio": 0.9, "text_copy_ratio": 0.95} for s in (250, 500)]
    names = ["text-mha-l2", "text-mha-l4mlp", "text-cope-l2-pkgs", *[
        f"text-mha-l2-cal{i}" for i in range(12)]]
    for name in names:
        write_log(tmp_path / name, records)
    traj = trajectories([tmp_path / n for n in names])
    fig = figure(traj)
    rows = {t.name: t.xaxis for t in fig.data if t.showlegend}
    assert {rows[n] for n in names[:3]} == {"x"} and {rows[n] for n in names[3:]} == {"x3"}
    looks = {(t.line.color, t.line.dash, t.marker.symbol) for t in fig.data if t.showlegend}
    assert len(looks) == len(names)                # 15 runs, 15 looks (the old palette had 10)
    assert run_style("text-cope-l2-pkgs", 0)[0]["color"] == VARIANT_COLOURS["cope"]
    assert run_style("text-mha-l2-v1", 3)[2] is False   # a calibration run, not a zoo model
    few = figure(traj[traj.run.isin(names[:2])], val_loss=True, split=False)
    assert len({t.line.color for t in few.data}) == 2 and len(few.data) == 6
