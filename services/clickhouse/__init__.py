"""ClickHouse plumbing: open an archive (embedded chDB or a server), its table migrations, SQL helpers."""
