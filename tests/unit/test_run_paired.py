"""Held-out units and paired differences on numbers worked by hand."""
import pytest

from coevolve.services.run.paired import mean_ci95, paired, units, verdict


def test_the_interval_is_students_t_over_the_values():
    mean, ci = mean_ci95([0.2, 0.4])
    assert mean == pytest.approx(0.3)
    assert ci == pytest.approx([0.3 - 12.706 * 0.1, 0.3 + 12.706 * 0.1])  # sd 0.1414 / sqrt 2 = 0.1
    assert mean_ci95([0.5]) == (0.5, None) and mean_ci95([]) == (None, None)
    big = [0.0, 1.0] * 20  # 39 degrees of freedom: the normal quantile
    assert mean_ci95(big)[1][1] - 0.5 == pytest.approx(1.96 * (10 / 39) ** 0.5 / 40 ** 0.5)


def test_units_are_the_last_evaluation_per_seed_and_task():
    runs = [{"seed": 0, "held_out": {"0": {"a": 0.0}, "6": {"a": 1.0}}}, {"seed": 1, "held_out": {"6": {"a": 0.5}}},
            {"seed": 2, "held_out": {}}]
    assert units(runs) == {(0, "a"): 1.0, (1, "a"): 0.5}


def test_a_paired_difference_uses_only_shared_units_and_gives_the_detectable_difference():
    a = {(0, "x"): 1.0, (0, "y"): 1.0, (0, "z"): 0.0, (1, "x"): 1.0, (9, "q"): 1.0}
    b = {(0, "x"): 0.0, (0, "y"): 1.0, (0, "z"): 0.0, (1, "x"): 0.0}
    result = paired(a, b)
    # differences 1, 0, 0, 1: mean 0.5, sd 0.5774, se 0.2887
    assert (result["pairs"], result["discordant"]) == (4, 2) and result["difference"] == pytest.approx(0.5)
    assert result["detectable"] == pytest.approx(2.80 * 0.57735 / 2, rel=1e-4)
    assert result["ci95"] == pytest.approx([0.5 - 3.182 * 0.28868, 0.5 + 3.182 * 0.28868], rel=1e-4)
    assert verdict(result).startswith("not resolved (the interval holds 0); this design detects 0.808")
    assert verdict(paired({(0, "x"): 1.0}, {(0, "x"): 0.0})) == "fewer than two pairs: no interval"
