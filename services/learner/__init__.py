"""The learner: GRPO maths, training config, sequences, and the torch and DeepSpeed training engines."""
