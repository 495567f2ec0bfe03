"""The loop's plots without an engine: data shaping by hand-computed values, drawing from handmade views."""
from __future__ import annotations

import matplotlib.image

from coevolve.services.analytics.loop import PHASES
from coevolve.services.analytics.plots import html_table
from coevolve.services.analytics.plots_loop import draw_loop, rejections_by_stage, stacked, top_reasons
from coevolve.services.analytics.view import View

VERDICTS = [["a", "validated", "passed", "dual pass", 3], ["a", "rejected", "novel", "duplicate of t1", 2],
            ["a", "rejected", "executable", "no such file", 4], ["a", "rejected", "executable", "bad argument", 1],
            ["b", "rejected", "not recorded", "not executable", 5], ["b", "rejected", "well_formed", "", 1]]


def _views() -> dict[str, View]:
    phases = [[r, s, 5.0, 0.5, 3.0, 0.5, 0.4, 0.1 * (s % 2), 0.5, 10.0] for r in ("a", "b") for s in range(1, 5)]
    return {
        "evaluation": View("evaluation", "eval", ["run_id", "split", "step", "tasks", "success_rate", "mean_score"],
                           [["a", "test", 0, 10, 0.1, 0.2], ["a", "test", 4, 10, 0.3, 0.5]]),
        "pool": View("pool", "pool", ["run_id", "step", "pool_size", "synthesized", "share", "trained", "z", "r", "t"],
                     [["a", s, 100 + s, s, s / (100 + s), 2 * s, 0, 0, 10] for s in range(1, 5)]),
        "step_time": View("step_time", "time", ["run_id", "step", *PHASES, "other", "duration"], phases),
        "time_share": View("time_share", "share", ["run_id", "steps", "seconds", *PHASES],
                           [[r, 4, 40.0, 0.5, 0.05, 0.3, 0.05, 0.04, 0.005] for r in ("a", "b")]),
        "explorations": View("explorations", "exp", ["run_id", "step", "strategy", "explorations"],
                             [["a", 1, "signal-guided", 2], ["a", 1, "random-fallback", 1], ["a", 3, "random", 4]]),
        "verdicts": View("verdicts", "verdicts", ["run_id", "verdict", "stage", "reason", "tasks"], VERDICTS),
        "stage_funnel": View("stage_funnel", "funnel", ["run_id", "stage", "reached", "passed", "pass_rate"], []),
        "task_origin": View("task_origin", "origin", ["run_id", "strategy", "signal_kind", "validated", "trained_on"],
                            [["a", "signal-guided", "boundary", 3, 2], ["a", "random-fallback", "", 1, 0]]),
    }


def test_stacked_fills_missing_steps_with_zero():
    rows = [["a", 1, "signal-guided", 2], ["a", 1, "random-fallback", 1], ["a", 3, "random", 4],
            ["b", 2, "random", 9]]
    assert stacked(rows, "a", 1, 2, 3) == ([1, 3], {"signal-guided": [2, 0], "random-fallback": [1, 0],
                                                   "random": [0, 4]})


def test_rejections_by_stage_follow_the_validators_order_with_validated_last():
    got = rejections_by_stage(VERDICTS)
    assert list(got["a"].items()) == [("executable", 5), ("novel", 2), ("passed", 3)]
    assert list(got["b"].items()) == [("well_formed", 1), ("not recorded", 5)]


def test_top_reasons_count_rejections_only_most_first_and_shorten():
    assert top_reasons(VERDICTS) == [("not recorded: not executable", 5), ("executable: no such file", 4),
                                     ("novel: duplicate of t1", 2), ("executable: bad argument", 1),
                                     ("well_formed", 1)]
    assert top_reasons(VERDICTS, limit=1, width=10) == [("not recor…", 5)]


def test_html_table_escapes_and_says_how_many_rows_are_left_out():
    view = View("v", "t", ["run_id", "reason"], [["a", "<b>&"], ["b", None], ["c", 0.123456]])
    text = html_table(view, limit=2)
    assert "&lt;b&gt;&amp;" in text and "<td></td>" in text and "0.1235" not in text
    assert "1 more rows" in text
    assert "0.1235" in html_table(view)


def test_every_loop_plot_is_drawn_from_its_rows(tmp_path):
    files = draw_loop(_views(), tmp_path)
    assert {n: [p.name for p in f] for n, f in files.items()} == {
        "evaluation": ["evaluation.png"], "pool": ["task_pool.png"], "step_time": ["step_time.png"],
        "explorations": ["explorations.png"], "verdicts": ["verdicts.png"], "task_origin": ["task_origin.png"]}
    for paths in files.values():
        pixels = matplotlib.image.imread(paths[0])
        assert pixels.shape[0] > 300 and pixels.std() > 0.05, paths[0]


def test_views_without_rows_draw_nothing(tmp_path):
    empty = {name: View(name, view.title, view.columns, [], "no events") for name, view in _views().items()}
    assert draw_loop(empty, tmp_path) == {}
    assert not list(tmp_path.glob("*.png"))
