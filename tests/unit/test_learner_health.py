"""The learner's /healthz notices a hung learner within minutes: its rollouts beat at every generation round
(the runner's stop poll), so the allowance need not cover a whole step on a CPU."""
import time

from coevolve.services.agent.config import BackendConfig, EpisodeLimits, SamplingConfig
from coevolve.services.agent.episodes import EpisodesStopped, run_episodes
from coevolve.services.envs.bfcl_data import load_tasks
from coevolve.services.learner.config import LearnerConfig, LearnerSettings
from coevolve.services.learner.loop.service import Learner
from tests.agent_helpers import ScriptedBackend, byte_tokenizer


def test_every_generation_round_beats_and_a_stop_ends_the_rollouts(tmp_path):
    service = Learner(LearnerSettings(LearnerConfig(workdir=tmp_path),
                                      backend=BackendConfig(model="tiny-random", backend="transformers")))
    assert service.stale_s <= 900
    rounds = []

    def answer(request):
        rounds.append(time.monotonic() - service.last_beat)
        return "[ls()]"

    service.last_beat -= service.stale_s + 1  # a step that has run past the allowance so far
    assert not service.health()[0]
    backend = ScriptedBackend(byte_tokenizer(), answer)
    tasks, limits = load_tasks(split="train")[:1], EpisodeLimits(max_user_turns=2, max_context_tokens=100_000)
    episodes = run_episodes(tasks, "bfcl", backend, SamplingConfig(max_new_tokens=8), limits,
                            should_stop=service._alive)
    assert episodes and rounds and max(rounds) < 5  # each round came right after a beat
    assert service.health()[0]
    service.stop()
    try:
        run_episodes(tasks, "bfcl", backend, SamplingConfig(max_new_tokens=8), limits, should_stop=service._alive)
    except EpisodesStopped:
        pass
    else:
        raise AssertionError("a stopped learner's rollouts went on")
