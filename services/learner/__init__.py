"""The learner, in three rooms, with the settings all three read (`config.py`):

- `trainer/`: the GRPO maths and the trainers that apply it to one process's model.
- `ranks/`: several training processes under torchrun, rank 0 driving the others.
- `loop/`: the `coevolve learner` service and one GRPO step: tasks in, rollouts, update, events out.
"""
