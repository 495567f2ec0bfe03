"""The archive service: `coevolve archiver` (every topic into ClickHouse) and `coevolve archive import`
(Avro log files)."""
