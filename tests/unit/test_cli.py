"""The command line: one Typer app, and --help on every subcommand."""
import pytest
from typer.main import get_command
from typer.testing import CliRunner

from coevolve.services.cli import app
from tests.cli_output import plain


def _commands(group, prefix=()):
    for name, cmd in group.commands.items():
        yield prefix + (name,)
        if hasattr(cmd, "commands"):  # a group (Typer vendors its own click)
            yield from _commands(cmd, prefix + (name,))


ALL = list(_commands(get_command(app)))


def test_the_commands_are_exactly_these():
    assert sorted(ALL) == sorted([
        ("run",), ("ablate",), ("check",), ("learner",), ("explorer",), ("validator",), ("archiver",),
        ("streams",), ("streams", "worker"), ("replay",), ("analyze",), ("eval",), ("simulate",), ("broker",),
        ("topics",), ("topics", "create"), ("deadletters",), ("deadletters", "list"), ("deadletters", "replay"),
        ("archive",), ("archive", "import"), ("archive", "restore"), ("env",), ("env", "score"), ("env", "show")])


@pytest.mark.parametrize("path", ALL, ids=" ".join)
def test_every_subcommand_has_help(path):
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output and "--help" in result.output


def test_missing_bootstrap_says_how_to_fix_it(monkeypatch):
    monkeypatch.delenv("KAFKA_BOOTSTRAP", raising=False)
    result = CliRunner().invoke(app, ["topics", "create"])
    assert result.exit_code != 0
    assert "KAFKA_BOOTSTRAP" in plain(result.output)


def test_invalid_simulation_is_refused_with_the_reason(tmp_path):
    result = CliRunner().invoke(app, ["simulate", "--tasks", "3", "--batch-tasks", "5",
                                      "--output", str(tmp_path / "x.avro")])
    assert result.exit_code != 0 and "exceeds tasks" in plain(result.output)


def test_simulate_reads_its_environment_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMULATE_TASKS", "3")
    result = CliRunner().invoke(app, ["simulate", "--batch-tasks", "5", "--output", str(tmp_path / "x.avro")])
    assert result.exit_code != 0 and "batch_tasks (5) exceeds tasks (3)" in plain(result.output)


def test_a_service_flag_shows_its_settings_default_and_doc():
    result = CliRunner().invoke(app, ["explorer", "--help"], terminal_width=200)
    text = " ".join(plain(result.output).split())
    assert "R: independent exploration runs (rounds) per cluster. (default: 3)" in text


def test_run_model_sets_the_learners_model_and_a_process_with_its_own_policy(monkeypatch):
    from coevolve.services.run import command

    plans = []
    monkeypatch.setattr(command, "run_loop", lambda plan, *a, **k: plans.append(plan) or {"state": "completed"})
    assert CliRunner().invoke(app, ["run", "--preset", "smoke", "--model", "tiny-random"]).exit_code == 0
    assert plans[-1].value("learner", "model") == "tiny-random" and plans[-1].value("explorer", "model") is None
    alone = ["run", "--preset", "smoke", "--model", "tiny-random", "--set", "run.shared_policy=explorer"]
    assert CliRunner().invoke(app, alone).exit_code == 0
    assert plans[-1].value("validator", "model") == "tiny-random" and plans[-1].value("explorer", "model") is None
