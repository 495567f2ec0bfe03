"""The rollout fleet: `vllm serve` processes the learner drives over HTTP and updates through vLLM's
weight-transfer API (config, local servers, the CPU transfer engine, the client backend)."""
