"""Presets and overrides of `coevolve run`: every key is checked before anything starts."""
import pytest

from coevolve.services.run.plan import make_plan, parse_override, preset_names
from coevolve.services.runtime.config import ConfigError


def test_the_four_presets_ship_and_load():
    assert {"smoke", "demo", "study", "paper"} <= set(preset_names())
    for name in ("smoke", "demo", "study", "paper"):
        plan = make_plan(name)
        assert plan.preset == name and plan.run.steps >= 1


def test_the_study_is_the_demo_loop_with_a_larger_held_out_evaluation_at_its_start_and_end():
    demo, study = make_plan("demo").sections, make_plan("study").sections
    assert study["learner"]["eval_tasks"] == 48 > demo["learner"]["eval_tasks"]
    assert study["learner"]["eval_at_start"] and study["learner"]["eval_subjects"]
    assert {k: v for k, v in study["learner"].items() if k != "eval_tasks"} == {
        k: v for k, v in demo["learner"].items() if k != "eval_tasks"}
    assert {k: v for k, v in study.items() if k != "learner"} == {k: v for k, v in demo.items() if k != "learner"}


def test_paper_preset_holds_the_papers_settings():
    plan = make_plan("paper")
    learner = plan.sections["learner"]
    assert (learner["lr"], learner["group_size"], learner["batch_tasks"]) == (1e-6, 8, 32)
    assert (learner["clip_low"], learner["clip_high"], learner["kl_beta"]) == (0.20, 0.28, 0.001)
    assert (learner["temperature"], learner["max_new_tokens"], learner["reward"]) == (0.9, 4096, "binary")
    assert plan.run.steps == 120 and learner["seed_tasks"] == 100
    assert plan.sections["explorer"]["every_steps"] == 10 and plan.sections["explorer"]["backend"] == "openai"


def test_overrides_reach_the_process_environment_as_section_prefixed_variables():
    plan = make_plan("smoke", ["learner.lr=1e-5", "streams.success_threshold=0.4", "run.steps=2",
                               "explorer.cluster_by_task=false"])
    env = plan.env("learner")
    assert float(env["LEARNER_LR"]) == 1e-5 and env["LEARNER_STEPS"] == "2"
    assert plan.env("streams")["STREAMS_SUCCESS_THRESHOLD"] == "0.4"
    assert plan.env("explorer")["EXPLORER_CLUSTER_BY_TASK"] == "false"


def test_a_misspelt_field_fails_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"learner\.batch_task is not a setting.*did you mean 'batch_tasks'"):
        make_plan("smoke", ["learner.batch_task=1"])


def test_a_bad_value_fails_before_anything_starts():
    with pytest.raises(ConfigError, match="reward"):
        make_plan("smoke", ["learner.reward=sometimes"])
    with pytest.raises(ConfigError, match="strategy"):
        make_plan("smoke", ["explorer.strategy=clever"])


def test_settings_the_run_manages_cannot_be_overridden():
    with pytest.raises(ConfigError, match="kafka_bootstrap is not a setting"):
        make_plan("smoke", ["learner.kafka_bootstrap=elsewhere:9092"])


def test_unknown_sections_presets_and_malformed_overrides_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="unknown section 'trainer'"):
        make_plan("smoke", ["trainer.lr=1"])
    with pytest.raises(ConfigError, match="unknown preset 'tiny'"):
        make_plan("tiny")
    with pytest.raises(ConfigError, match="SECTION.FIELD=VALUE"):
        parse_override("lr=1")
    bad = tmp_path / "bad.yaml"
    bad.write_text("learner: [1, 2]\n")
    with pytest.raises(ConfigError, match="mappings of fields"):
        make_plan(str(bad))


def test_a_preset_file_of_ones_own_loads(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("run:\n  steps: 7\nlearner:\n  model: tiny-random\n")
    plan = make_plan(str(mine))
    assert plan.preset == "mine" and plan.run.steps == 7 and plan.env("learner")["LEARNER_MODEL"] == "tiny-random"


def test_shared_policy_names_only_the_explorer_or_validator_and_does_not_fight_their_model_setting():
    assert make_plan("smoke").run.sharing == ("explorer", "validator")
    assert make_plan("smoke", ["run.shared_policy="]).run.sharing == ()
    with pytest.raises(ConfigError, match="run.shared_policy names learner; only explorer and validator"):
        make_plan("smoke", ["run.shared_policy=validator,learner"])
    with pytest.raises(ConfigError, match="validator.model and run.shared_policy both choose"):
        make_plan("smoke", ["validator.model=tiny-random"])
    assert make_plan("smoke", ["validator.model=tiny-random", "run.shared_policy=explorer"]).run.sharing == (
        "explorer",)
    with pytest.raises(ConfigError, match=r"validator.tool_docs: the validator acts with the learner's policy "
                                          r"\(run.shared_policy\), so it takes learner.tool_docs"):
        make_plan("smoke", ["learner.tool_docs=signatures", "validator.tool_docs=signatures"])


def test_processes_take_the_learners_seed_pool_and_a_shared_policys_tool_listing_from_its_section():
    plan = make_plan("smoke", ["learner.tool_docs=signatures", "learner.seed_tasks=5"])
    assert plan.env("explorer")["EXPLORER_TOOL_DOCS"] == plan.env("validator")["VALIDATOR_TOOL_DOCS"] == "signatures"
    assert plan.env("explorer")["EXPLORER_SEED_TASKS"] == "5"
    assert plan.env("explorer")["EXPLORER_CATEGORIES"] == plan.value("learner", "categories")
    alone = make_plan("smoke", ["learner.tool_docs=signatures", "run.shared_policy=explorer",
                                "validator.model=tiny-random", "validator.tool_docs=full"])
    assert alone.value("validator", "tool_docs") == "full"  # its own policy lists tools its own way
    with pytest.raises(ConfigError, match=r"explorer.seed_tasks: the explorer works for the learner's pool, "
                                          r"so it takes learner.seed_tasks"):
        make_plan("smoke", ["explorer.seed_tasks=3"])
    inheriting = make_plan("smoke", ["learner.inherit_tasks=true", "learner.static_tasks=2"])
    assert inheriting.env("validator")["VALIDATOR_INHERIT_TASKS"] == inheriting.env("learner")["LEARNER_INHERIT_TASKS"]
    assert inheriting.env("explorer")["EXPLORER_STATIC_TASKS"] == "2"
    with pytest.raises(ConfigError, match=r"validator.inherit_tasks: .* so it takes learner.inherit_tasks"):
        make_plan("smoke", ["validator.inherit_tasks=true"])


def test_restarts_are_budgeted_per_window_with_a_backoff_and_checked():
    run = make_plan("smoke").run
    assert (run.restart_budget, run.restart_window_s, run.restart_backoff_s, run.restart_backoff_max_s) == (
        5, 600.0, 1.0, 60.0)
    with pytest.raises(ConfigError, match="run.restart_budget=-1 must be 0 or more"):
        make_plan("smoke", ["run.restart_budget=-1"])
    with pytest.raises(ConfigError, match="restart_window_s and restart_backoff_max_s must be positive"):
        make_plan("smoke", ["run.restart_window_s=0"])
    with pytest.raises(ConfigError, match=r"run\.restarts is not a setting"):
        make_plan("smoke", ["run.restarts=2"])


def test_liveness_allowances_are_per_service_over_the_defaults():
    run = make_plan("smoke", ["run.liveness_s={explorer: 600}"]).run
    assert run.liveness_s == {"streams": 120.0, "archiver": 120.0, "explorer": 600.0, "validator": 1800.0,
                              "learner": 300.0}
    with pytest.raises(ConfigError, match="run.liveness_s names trainer; the services are streams"):
        make_plan("smoke", ["run.liveness_s={trainer: 5}"])
    with pytest.raises(ConfigError, match=r"run.liveness_s.learner=0 must be a positive number"):
        make_plan("smoke", ["run.liveness_s={learner: 0}"])
    with pytest.raises(ConfigError, match=r"run.liveness_s=60 must map services to seconds"):
        make_plan("smoke", ["run.liveness_s=60"])
