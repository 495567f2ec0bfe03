"""BFCL's own multi-turn checker as the oracle: our verdicts must agree with it.

The oracle runs `bfcl_eval`'s `multi_turn_checker`, which executes calls with `eval`; that is why it
lives only here, on call sequences this test generates from BFCL's own ground truth.
"""
from __future__ import annotations

import ast
import copy
import itertools
import random
from collections import Counter

import pytest

from coevolve.services.envs import bfcl_data
from coevolve.services.envs.bfcl import reference_problems, score_calls

pytestmark = pytest.mark.slow

_names = itertools.count()


def oracle_valid(task, turns) -> bool:
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    model_name = f"coevolve_oracle_{next(_names)}"
    entry = {"id": task.task_id, "initial_config": copy.deepcopy(dict(task.initial_state)),
             "involved_classes": list(task.involved_classes)}
    # BFCL's evaluation drops steps that decode to no calls, so an empty turn has no steps.
    decoded = [[list(calls)] if calls else [] for calls in turns]
    try:
        return multi_turn_checker(decoded, [list(t) for t in task.reference], entry,
                                  bfcl_data.category_of(task.task_id), model_name)["valid"]
    finally:
        # The checker keeps every episode's instances in its module globals; drop ours.
        namespace = vars(multi_turn_utils)
        for key in [k for k in namespace if k.startswith(model_name)]:
            del namespace[key]


def _wrong_argument(call: str) -> str | None:
    node = ast.parse(call, mode="eval").body
    values = list(node.args) + [kw.value for kw in node.keywords]
    if not values or not isinstance(values[0], ast.Constant):
        return None
    value = values[0].value
    if isinstance(value, bool):
        values[0].value = not value
    elif isinstance(value, (int, float)):
        values[0].value = value + 1
    elif isinstance(value, str):
        values[0].value = value + "x"
    else:
        return None
    return ast.unparse(node)


def perturb(reference, rng: random.Random):
    """One perturbed copy of a reference call sequence, and what was done; None if not applicable."""
    turns = [list(t) for t in reference]
    turn = rng.choice([i for i, t in enumerate(turns) if t])
    calls = turns[turn]
    at = rng.randrange(len(calls))
    kind = rng.choice(["drop", "swap", "duplicate", "wrong_argument", "empty_turn", "move_back",
                       "extra_call", "unknown_function"])
    if kind == "drop":
        calls.pop(at)
    elif kind == "swap":
        if len(calls) < 2:
            return None, kind
        at = rng.randrange(len(calls) - 1)
        calls[at], calls[at + 1] = calls[at + 1], calls[at]
    elif kind == "duplicate":
        calls.insert(at, calls[at])
    elif kind == "wrong_argument":
        wrong = _wrong_argument(calls[at])
        if wrong is None:
            return None, kind
        calls[at] = wrong
    elif kind == "empty_turn":
        turns[turn] = []
    elif kind == "move_back":
        if turn == 0:
            return None, kind
        turns[turn - 1].append(calls.pop(at))
    elif kind == "extra_call":
        calls.insert(at, rng.choice([c for t in reference for c in t]))
    elif kind == "unknown_function":
        calls[at] = "no_such_function" + calls[at][calls[at].index("("):]
    return turns, kind


@pytest.mark.parametrize("category", bfcl_data.CATEGORIES)
def test_every_ground_truth_scores_full_success(category):
    tasks = bfcl_data.load_category(category)
    assert len(tasks) == 200
    failures = []
    for task in tasks:
        result = score_calls(task, task.reference)
        if not (result["success"] and result["score"] == 1.0):
            failures.append((task.task_id, [v for v in result["turns"] if not v["passed"]]))
        if reference_problems(task):
            failures.append((task.task_id, reference_problems(task)))
    assert failures == []


@pytest.mark.parametrize("category", bfcl_data.CATEGORIES)
def test_verdicts_agree_with_bfcl_checker_on_perturbed_sequences(category):
    rng = random.Random(f"oracle-{category}")
    seen, agreed, oracle_passed = Counter(), Counter(), Counter()
    disagreements = []
    for task in bfcl_data.load_category(category):
        candidates = [(task.reference, "ground_truth")]
        for _ in range(6):
            turns, kind = perturb(task.reference, rng)
            if turns is not None:
                candidates.append((turns, kind))
        for turns, kind in candidates:
            expected = oracle_valid(task, turns)
            ours = score_calls(task, turns)
            seen[kind] += 1
            oracle_passed[kind] += expected
            agreed[kind] += ours["success"] == expected
            if ours["success"] != expected:
                disagreements.append((task.task_id, kind, turns, expected, ours["turns"]))
    print(f"\n{category}: {sum(seen.values())} sequences, {sum(agreed.values())} agree; "
          f"per kind (seen, oracle-valid): { {k: (seen[k], oracle_passed[k]) for k in seen} }")
    assert disagreements == []
    assert oracle_passed["ground_truth"] == 200
    # Both verdicts occur among the perturbations, so agreement is not trivially all-fail.
    perturbed_valid = sum(oracle_passed.values()) - oracle_passed["ground_truth"]
    assert 0 < perturbed_valid < sum(seen.values()) - seen["ground_truth"]
    assert sum(seen.values()) > 1000
