"""`coevolve replay`'s options in one dataclass: thresholds (defaults from streams.rules.Thresholds),
where to read, which engine, what to write."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from coevolve.services.runtime.config import ConfigError, doc
from coevolve.streams.rules import EvidenceLimits, Thresholds

ENGINES = ("python", "sql")
DECODERS = ("chdb", "fastavro")
# Where a Job takes the archive URL from (a Secret), as every service's config: the service's key first.
CLICKHOUSE_ENV = ("REPLAY_CLICKHOUSE_URL", "CLICKHOUSE_URL")


@dataclass(frozen=True)
class ReplayConfig:
    inputs: tuple[Path, ...] = doc((), "Avro log files: trajectories and completed steps (a run.avro's step "
                                   "file beside it is added).")
    bootstrap: str | None = doc(None, "Without inputs, read the topics from offset zero; also the broker "
                                "for publish and a topic to compare with.")
    clickhouse: str | None = doc(None, "Replay from the archive at this URL (chdb:///dir or a server URL); "
                                 "implies the SQL engine. Default: $REPLAY_CLICKHOUSE_URL, then "
                                 "$CLICKHOUSE_URL, when no input or bootstrap is given.")
    database: str = doc("coevolve", "ClickHouse database of the archive.")
    success_threshold: float = doc(Thresholds.success_threshold, "tau: an attempt or rollout succeeds at >= tau.")
    window: int = doc(Thresholds.window, "W: previous attempts forgetting looks back on.")
    rare_threshold: float = doc(Thresholds.rare_threshold, "theta, percent: rare when 0 < c_p/N < theta/100.")
    pattern_length: int = doc(Thresholds.pattern_length, "n: consecutive action names per pattern.")
    engine: str = doc("python", "python (the reference) or sql (ClickHouse; same signals).")
    decoder: str = doc("chdb", "Decoder of input files for the python engine: chdb (ClickHouse reads them) "
                       "or fastavro.")
    workers: int = doc(1, "fastavro decoding processes (2 pays off only where decoding dominates pickling).")
    evidence: bool = doc(True, "Write each signal's evidence into the output; without it, the SQL engine "
                         "formats the lines in ClickHouse (fastest).")
    output: Path | None = doc(None, "Write the signals here as JSON lines.")
    publish: str | None = doc(None, "Send the signals to this topic (needs bootstrap).")
    compare: str | None = doc(None, "Diff against a signal JSON-lines file, or a topic.")

    def __post_init__(self) -> None:
        try:
            self.thresholds()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if not self.inputs and not self.bootstrap and not self.clickhouse:
            raise ConfigError("give --input PATH, --bootstrap HOST:PORT or --clickhouse URL (or set CLICKHOUSE_URL)")
        if self.engine not in ENGINES:
            raise ConfigError(f"--engine {self.engine!r}: choose python or sql")
        if self.decoder not in DECODERS:
            raise ConfigError(f"--decoder {self.decoder!r}: choose one of {', '.join(DECODERS)}")
        if self.publish and not self.bootstrap:
            raise ConfigError("--publish needs --bootstrap HOST:PORT")
        if self.sql and bool(self.inputs) == bool(self.clickhouse):
            raise ConfigError("--engine sql reads either --input FILES (embedded chDB) or --clickhouse URL "
                              "(the archive)")

    @classmethod
    def of(cls, environ: Mapping[str, str] | None = None, **flags) -> "ReplayConfig":
        """The config from command-line flags; a flag left at None takes the field's default. With
        `environ`, the archive URL comes from CLICKHOUSE_ENV when no flag names a source: an explicit
        --input or --bootstrap is never overridden by the environment."""
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in flags.items() if v is not None and k in names}
        if environ is not None and not (values.get("inputs") or values.get("bootstrap") or values.get("clickhouse")):
            url = next((environ[key] for key in CLICKHOUSE_ENV if environ.get(key)), None)
            if url:
                values["clickhouse"] = url
        return cls(**values)

    @property
    def sql(self) -> bool:
        return self.engine == "sql" or bool(self.clickhouse)

    def thresholds(self) -> Thresholds:
        return Thresholds(self.success_threshold, self.window, self.rare_threshold, self.pattern_length)

    def limits(self) -> EvidenceLimits:
        return EvidenceLimits()
