"""Infrastructure every service shares: config layering, structured logs, health and metrics, the service skeleton."""
