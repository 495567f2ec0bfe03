"""The ClickHouse archive: every event of every topic, replayable signals in SQL, and the run's analyses."""
