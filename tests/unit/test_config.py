"""Config layering: defaults, then KEY, then SERVICE_KEY, then explicit overrides."""
from dataclasses import dataclass

import pytest

from coevolve.services.runtime.config import ConfigError, describe, doc, load


@dataclass(frozen=True)
class _Cfg:
    kafka_bootstrap: str = doc("127.0.0.1:9092", "Broker address.")
    batch: int = doc(100, "Batch size.")
    verbose: bool = doc(False, "Log more.")


def test_defaults_then_generic_then_service_specific_then_overrides():
    assert load(_Cfg, "learner", environ={}).kafka_bootstrap == "127.0.0.1:9092"
    env = {"KAFKA_BOOTSTRAP": "k:1"}
    assert load(_Cfg, "learner", environ=env).kafka_bootstrap == "k:1"
    env["LEARNER_KAFKA_BOOTSTRAP"] = "k:2"
    assert load(_Cfg, "learner", environ=env).kafka_bootstrap == "k:2"
    assert load(_Cfg, "explorer", environ=env).kafka_bootstrap == "k:1"
    assert load(_Cfg, "learner", {"kafka_bootstrap": "k:3"}, environ=env).kafka_bootstrap == "k:3"


def test_values_are_converted_to_the_field_type():
    cfg = load(_Cfg, "x", environ={"BATCH": "7", "X_VERBOSE": "true"})
    assert cfg.batch == 7 and cfg.verbose is True


@pytest.mark.parametrize("env,match", [({"BATCH": "many"}, "BATCH='many' is not a int"),
                                       ({"VERBOSE": "maybe"}, "use true or false")])
def test_bad_values_say_how_to_fix_them(env, match):
    with pytest.raises(ConfigError, match=match):
        load(_Cfg, "x", environ=env)


def test_every_field_is_documented():
    assert [(n, d) for n, d, _ in describe(_Cfg)] == [("kafka_bootstrap", "127.0.0.1:9092"),
                                                       ("batch", 100), ("verbose", False)]
    assert all(text for _, _, text in describe(_Cfg))
