"""Per-step plots: a few steps get integer ticks, not 1.25 and 1.75."""
from coevolve.services.analytics.plots import _save, plt, reward_plot
from coevolve.services.analytics.view import View


def test_a_three_step_plot_has_integer_step_ticks_only(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    view = View(name="reward_eval", title="reward", columns=["run", "step", "train", "eval"],
                rows=[["r", 1, 0.1, None], ["r", 2, 0.3, None], ["r", 3, 0.2, 0.5]])
    assert reward_plot(view, tmp_path).is_file()
    ticks = [t for t in figures[0].axes[0].get_xticks() if 1 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_an_axis_with_ticks_of_its_own_keeps_them(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    fig, ax = plt.subplots()
    ax.imshow([[0.0, 1.0]])
    ax.set_xticks([0, 1], ["step 4", "step 9"])
    ax.set(xlabel="training step (blank: task not sampled)")
    _save(fig, tmp_path / "heat.png")
    assert [t.get_text() for t in figures[0].axes[0].get_xticklabels()] == ["step 4", "step 9"]
