"""Kafka plumbing: the embedded Tansu broker, the topic catalog, and typed producer/consumer."""
