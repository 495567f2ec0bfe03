"""The batched episode driver on real BFCL tasks, with a scripted backend and a byte-level tokenizer."""
import pytest

from coevolve.schemas.codec import default_registry
from coevolve.services.agent.config import EpisodeLimits, SamplingConfig
from coevolve.services.agent.episodes import EpisodesStopped, run_episodes
from coevolve.services.envs import make_env
from coevolve.services.envs.bfcl_data import get_task
from coevolve.services.envs.calls import parse_action
from tests.agent_helpers import ScriptedBackend, byte_tokenizer, reference_script

SAMPLING = SamplingConfig(temperature=0.0, max_new_tokens=400)
# One token per byte: a BFCL prompt is about 18k tokens here.
ROOM = 100_000
LIMITS = EpisodeLimits(max_context_tokens=ROOM)


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def task():
    return get_task("multi_turn_base_0")


@pytest.fixture(scope="module")
def perfect(tokenizer, task):
    backend = ScriptedBackend(tokenizer, reference_script(task))
    (episode,) = run_episodes([task], "bfcl", backend, SAMPLING, LIMITS)
    return backend, episode


def test_an_agent_that_makes_the_reference_calls_succeeds(perfect, task):
    _, episode = perfect
    assert episode.success and episode.score == 1.0 and episode.truncated is None
    assert episode.turns == len(task.turns) == 4
    assert episode.calls == [[c.render() for c in parse_action(list(turn)).calls] for turn in task.reference]
    assert [a["turn"] for a in episode.actions] == [t for t, turn in enumerate(task.reference) for _ in turn]
    assert episode.actions[0]["name"] == "cd" and episode.actions[0]["arguments"] == '{"folder": "document"}'


def test_the_token_sequence_is_the_whole_conversation_rendered_by_the_template(perfect, tokenizer):
    _, episode = perfect
    from coevolve.services.agent.templates import chat_messages

    rendered = tokenizer.apply_chat_template(chat_messages(episode.messages, first=True), tokenize=False)
    assert tokenizer.decode(episode.token_ids) == rendered


def test_masked_tokens_are_exactly_the_generated_ids_and_decode_to_the_generated_texts(perfect, tokenizer):
    backend, episode = perfect
    segments = episode.generated_segments()
    assert [tuple(s) for s in segments] == [c.token_ids for c in backend.completions]
    assert [tokenizer.decode(s, skip_special_tokens=True) for s in segments] == [c.text for c in backend.completions]
    assert sum(episode.loss_mask) == episode.completion_tokens == sum(len(s) for s in segments)


def test_logprobs_align_with_the_mask(perfect):
    backend, episode = perfect
    assert len(episode.token_ids) == len(episode.loss_mask) == len(episode.logprobs)
    assert all(lp == 0.0 for lp, bit in zip(episode.logprobs, episode.loss_mask) if not bit)
    generated = [lp for lp, bit in zip(episode.logprobs, episode.loss_mask) if bit]
    assert generated == [lp for c in backend.completions for lp in c.logprobs]
    assert episode.prompt_tokens + episode.completion_tokens == len(episode.token_ids)


def test_each_request_carries_the_episode_tokens_so_far(perfect):
    backend, episode = perfect
    for request in (r for batch in backend.batches for r in batch):
        n = len(request.prompt_ids)
        assert list(request.prompt_ids) == episode.token_ids[:n]
        assert episode.loss_mask[n - 1] == 0
    assert len(backend.batches[0][0].prompt_ids) == episode.prompt_len


def test_the_episode_encodes_as_a_trajectory_event(perfect):
    _, episode = perfect
    record = episode.to_trajectory_event("run-1", step=2, rollout_index=1, group_size=4)
    name, decoded = default_registry().decode(default_registry().encode("TrajectoryRecorded", record))
    assert name == "TrajectoryRecorded"
    assert decoded["score"] == 1.0 and decoded["success"] and decoded["turn_count"] == 4
    assert len(decoded["actions"]) == 10 and decoded["completion_tokens"] == episode.completion_tokens
    assert record["event_id"] == episode.to_trajectory_event("run-1", 2, 1, 4)["event_id"]


def test_episodes_run_in_batches_of_at_most_max_in_flight_and_keep_task_order(tokenizer):
    tasks = [get_task(f"multi_turn_base_{i}") for i in (0, 1, 2)]
    scripts = {t.task_id: reference_script(t) for t in tasks}

    def script(request):
        first_user = next(m["content"] for m in request.messages if m["role"] == "user")
        task = next(t for t in tasks if t.turns[0] == first_user)
        return scripts[task.task_id](request)

    backend = ScriptedBackend(tokenizer, script)
    done = []
    episodes = run_episodes(tasks, "bfcl", backend, SAMPLING, LIMITS, on_done=done.append, max_in_flight=2)
    assert [e.task_id for e in episodes] == [t.task_id for t in tasks]
    assert all(e.success for e in episodes)
    assert max(len(b) for b in backend.batches) == 2 and len(backend.batches[0]) == 2
    assert sorted(e.task_id for e in done) == sorted(t.task_id for t in tasks)


def test_a_malformed_call_becomes_an_observation_and_the_episode_goes_on(tokenizer, task):
    replies = iter(["[cd(folder=os.getcwd())]", "{\"name\": \"ls\", \"arguments\": 5}", "I am done."] + ["ok"] * 20)
    backend = ScriptedBackend(tokenizer, lambda request: next(replies))
    (episode,) = run_episodes([task], "bfcl", backend, SAMPLING, LIMITS)
    assert episode.done and episode.truncated is None and episode.score == 0.0
    assert episode.actions[0]["observation"].startswith("Invalid action")
    assert episode.actions[1]["name"] == "ls" and "must be a JSON object" in episode.actions[1]["observation"]
    assert episode.turns == 4


def test_backend_errors_become_observations_then_end_the_episode(tokenizer, task):
    backend = ScriptedBackend(tokenizer, lambda request: RuntimeError("connection reset"))
    (episode,) = run_episodes([task], "bfcl", backend, SAMPLING, EpisodeLimits(max_backend_errors=3, max_context_tokens=ROOM))
    assert len(backend.batches) == 3
    assert episode.truncated == "backend error: connection reset" and episode.score == 0.0
    assert episode.errors == ["connection reset"] * 3 and sum(episode.loss_mask) == 0


def test_a_backend_error_is_retried_and_the_episode_recovers(tokenizer, task):
    perfect = reference_script(task)
    failed = []

    def flaky(request):
        if not failed:
            failed.append(1)
            return RuntimeError("timeout")
        return perfect(request)

    (episode,) = run_episodes([task], "bfcl", ScriptedBackend(tokenizer, flaky), SAMPLING, LIMITS)
    assert episode.success and episode.truncated is None and episode.errors == ["timeout"]


def test_the_user_turn_limit_ends_the_episode_and_says_so(tokenizer, task):
    backend = ScriptedBackend(tokenizer, reference_script(task))
    (episode,) = run_episodes([task], "bfcl", backend, SAMPLING, EpisodeLimits(max_user_turns=2, max_context_tokens=ROOM))
    assert episode.truncated == "user-turn limit of 2 reached"
    assert episode.turns == 2 and episode.score == 0.5 and not episode.success


def test_episodes_list_the_tools_as_the_limits_say(tokenizer, task):
    backend = ScriptedBackend(tokenizer, reference_script(task))
    run_episodes([task], "bfcl", backend, SAMPLING, EpisodeLimits(tool_docs="signatures", max_context_tokens=ROOM))
    system = backend.batches[0][0].messages[0]["content"]
    assert "cd(folder: string): Change the current working directory" in system and '"name": "cd"' not in system


def test_the_calls_per_turn_limit_ends_the_episode_and_says_so(tokenizer, task):
    backend = ScriptedBackend(tokenizer, reference_script(task))
    (episode,) = run_episodes([task], "bfcl", backend, SAMPLING, EpisodeLimits(max_calls_per_turn=2, max_context_tokens=ROOM))
    assert episode.truncated == "more than 2 calls in turn 0" and episode.actions == []


def test_the_context_limit_caps_new_tokens_then_ends_the_episode(tokenizer, task):
    backend = ScriptedBackend(tokenizer, lambda request: "x" * 1000)
    prompt_len = len(backend.template.prompt_ids(make_env("bfcl").reset(task)))
    limit = prompt_len + 1500
    (episode,) = run_episodes([task], "bfcl", backend, SAMPLING, EpisodeLimits(max_context_tokens=limit))
    assert episode.truncated.startswith("context limit")
    assert len(episode.token_ids) <= limit
    assert all(r.max_new_tokens <= SAMPLING.max_new_tokens for b in backend.batches for r in b)
    last = backend.batches[-1][0]
    assert last.max_new_tokens == min(SAMPLING.max_new_tokens, limit - len(last.prompt_ids))


def test_a_prompt_longer_than_the_context_limit_ends_the_episode_before_any_generation(tokenizer, task):
    backend = ScriptedBackend(tokenizer, lambda request: "never")
    (episode,) = run_episodes([task], "bfcl", backend, SAMPLING, EpisodeLimits(max_context_tokens=100))
    assert backend.batches == [] and episode.truncated.startswith("context limit: the prompt alone")
    assert episode.turns == 1


def test_a_generation_cut_by_the_token_limit_is_closed_and_kept_unmasked_after_it(tokenizer, task):
    backend = ScriptedBackend(tokenizer, lambda request: "y" * 50)
    (episode,) = run_episodes([task], "bfcl", backend, SamplingConfig(temperature=0, max_new_tokens=8), LIMITS)
    first = backend.completions[0]
    assert first.finish_reason == "length" and len(first.token_ids) == 8
    start = episode.prompt_len
    assert episode.loss_mask[start:start + 8] == [1] * 8 and episode.loss_mask[start + 8] == 0
    assert episode.token_ids[start + 8] == tokenizer.eos_token_id


def test_text_only_backends_give_episodes_without_tokens(task):
    replies = iter(["[cd(folder='document')]", "Done."] + ["Done."] * 10)

    backend = ScriptedBackend(byte_tokenizer(), lambda request: next(replies))
    backend.tokenizer = None
    (episode,) = run_episodes([task], "bfcl", backend, SAMPLING, LIMITS)
    assert episode.token_ids == [] and episode.loss_mask == [] and episode.done
    assert all(r.prompt_ids is None for b in backend.batches for r in b)
    assert episode.calls[0] == ["cd(folder='document')"]


def test_a_prompt_rewrite_reaches_the_tokens_and_the_model(tokenizer, task):
    seen = []

    def script(request):
        seen.append(request.messages[0]["content"])
        return "Done."

    def add_context(task_, messages):
        return [{**messages[0], "content": messages[0]["content"] + "\nExplore: mv fails on missing files."}] + messages[1:]

    backend = ScriptedBackend(tokenizer, script)
    (episode,) = run_episodes([task], "bfcl", backend, SAMPLING, LIMITS, rewrite_prompt=add_context)
    assert all(s.endswith("Explore: mv fails on missing files.") for s in seen)
    assert "Explore: mv fails" in tokenizer.decode(episode.token_ids[:episode.prompt_len])


def test_a_stop_request_abandons_the_rollouts_between_rounds(tokenizer, task):
    rounds = []
    backend = ScriptedBackend(tokenizer, reference_script(task))
    with pytest.raises(EpisodesStopped, match="2 episodes running"):
        run_episodes([task, task], "bfcl", backend, SAMPLING, LIMITS,
                     should_stop=lambda: rounds.append(1) or len(rounds) > 2)
    assert len(rounds) == 3  # two rounds of generations ran, the third was refused
