"""Infrastructure at the bottom (`runtime/`, `kafka/`, `clickhouse/`), the environments (`envs/`), the
services (`archive/`, `analytics/`, the simulator), and the `coevolve` command (`cli.py`) on top."""
