"""The validator's core: the abstraction of explored tuples into a proposed task, and the validation
stages that run it in the environment. Pure or environment-only; the service loop wires them."""
