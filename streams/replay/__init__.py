"""`coevolve replay`: sources, two engines (Python, SQL) and reports, configured by ReplayConfig."""
