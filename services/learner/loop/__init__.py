"""The loop: the `coevolve learner` service (`service.py`) and what it runs, one GRPO step at a time: the
task pool and its feed, the step, the write-ahead journal and its replay, checkpoints, publishing,
telemetry, the warm-up before the first step and the evaluations.
"""
