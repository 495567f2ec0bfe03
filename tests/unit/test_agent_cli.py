"""`coevolve eval` refuses bad settings with a usage error before loading any model."""
from typer.testing import CliRunner

from coevolve.services.cli import app
from tests.cli_output import plain


def _run(*args):
    return CliRunner().invoke(app, ["eval", *args])


def test_an_unknown_model_is_a_usage_error_naming_the_known_ones(tmp_path):
    result = _run("--model", "gpt-7", "--output", str(tmp_path / "r.json"))
    assert result.exit_code == 2 and "tiny-random" in plain(result.output)
    assert not (tmp_path / "r.json").exists()


def test_the_openai_backend_without_an_endpoint_is_a_usage_error():
    result = _run("--backend", "openai")
    assert result.exit_code == 2 and "--base-url" in plain(result.output)


def test_an_unknown_split_or_environment_is_a_usage_error():
    assert "split" in plain(_run("--split", "dev").output)
    assert "only bfcl" in plain(_run("--env", "appworld").output)
