"""The explorer's core: which signals to explore each step, the reflection that turns a signal into an
exploration context, and the `random` strategy. Pure or environment-only; the service loop wires them."""
