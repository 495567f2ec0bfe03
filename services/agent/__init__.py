"""The agent runtime: models, generation backends, batched multi-turn episodes, evaluation."""
