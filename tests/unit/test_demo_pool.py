"""The demo preset's own learner settings: a task validated during a step joins the pool before the next
step, and that step draws it (fresh_first); later steps keep drawing synthesized tasks for half the batch
(synthetic_share), so a task whose first group scored alike gets more chances within the demo's six steps."""
from coevolve.services.learner.config import LearnerSettings
from coevolve.services.learner.loop.sampler import load_problem
from coevolve.services.learner.loop.service import Learner
from coevolve.services.run.plan import make_plan
from coevolve.services.runtime.config import assemble


def demo_learner() -> Learner:
    plan = make_plan("demo")
    env = plan.env("learner")
    return Learner(assemble(LearnerSettings, "learner", environ=env))


def validated(seed, task_id: str, run_id: str) -> dict:
    """What the validator publishes for a one-turn task abstracted from explorations of `seed` in a run."""
    return {**seed.to_record(), "task_id": task_id, "instruction_turns": [seed.turns[0]], "run_id": run_id,
            "reference_solution": [list(seed.reference[0])], "verdict": "validated", "source": "synthesized"}


def test_the_demo_pool_takes_a_validated_task_between_steps_and_the_next_step_draws_it():
    learner = demo_learner()
    pool = learner._pool()
    b = learner.cfg.batch_tasks
    assert learner.sampler_cfg.fresh_first and pool.size == learner.seeds.seed_tasks == 16
    pool.refresh(1)
    first = pool.draw(b)
    assert all(d.source == "seed" for d in first)
    seed = next(iter(pool.seed_tasks.values()))
    pool.offer(validated(seed, "synthesized_demo", learner.run_id))  # arrives while step 1 runs
    pool.offer(validated(seed, "synthesized_elsewhere", "an-earlier-run"))  # not inherited (inherit_tasks off)
    assert pool.size == 16
    pool.refresh(2)
    assert pool.size == 17 and load_problem(pool.synthesized["synthesized_demo"][0]) is None
    second = pool.draw(b)
    assert [d.task.task_id for d in second if d.source == "synthesized"] == ["synthesized_demo"]
    assert len(second) == b and len({d.task.task_id for d in second}) == b
    later = [d.source for _ in range(200) for d in pool.draw(b)]
    assert 0.4 < later.count("synthesized") / len(later) < 0.6  # learner.synthetic_share 0.5


def test_the_demo_explorer_falls_back_on_the_learners_own_seed_tasks():
    from coevolve.services.explorer.config import ExplorerSettings

    plan = make_plan("demo")
    explorer = assemble(ExplorerSettings, "explorer", environ=plan.env("explorer"))
    mine = [t.task_id for t in explorer.seeds.tasks()]
    assert set(mine) == set(demo_learner()._pool().seed_tasks) and len(set(mine)) == 16
    assert {t.split("_")[-2] for t in mine} == {"base", "param"}  # both categories, interleaved
