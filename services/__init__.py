"""Infrastructure at the bottom (`runtime/`, `kafka/`, `clickhouse/`), the environments (`envs/`) and the
agent runtime (`agent/`); the services on them (`learner/`, `explorer/`, `validator/`, `archive/`,
`analytics/`, the simulator); the loop's orchestration (`run/`, `pipeline.py`) and the `coevolve`
command (`cli/`) on top. The signal processors are in the sibling package `streams/`."""
