"""`coevolve replay`'s options in one dataclass: thresholds (defaults from streams.rules.Thresholds),
where to read, which engine, what to write."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path

from coevolve.services.runtime.config import ConfigError, doc
from coevolve.streams.replay.sweep import Sweep, parse_sweep
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
    # Thresholds left at None take streams.rules.Thresholds' defaults, or with against_run the run's own.
    success_threshold: float | None = doc(None, "tau: an attempt or rollout succeeds at >= tau (0.5).")
    window: int | None = doc(None, "W: previous attempts forgetting looks back on (5).")
    rare_threshold: float | None = doc(None, "theta, percent: rare when 0 < c_p/N < theta/100 (5).")
    pattern_length: int | None = doc(None, "n: consecutive action names per pattern (1).")
    engine: str = doc("python", "python (the reference) or sql (ClickHouse; same signals).")
    decoder: str = doc("chdb", "Decoder of input files for the python engine: chdb (ClickHouse reads them) "
                       "or fastavro.")
    workers: int = doc(1, "fastavro decoding processes (2 pays off only where decoding dominates pickling).")
    evidence: bool = doc(True, "Write each signal's evidence into the output; without it, the SQL engine "
                         "formats the lines in ClickHouse (fastest).")
    output: Path | None = doc(None, "Write the signals here as JSON lines.")
    publish: str | None = doc(None, "Send the signals to this topic (needs bootstrap).")
    compare: str | None = doc(None, "Diff against a signal JSON-lines file, or a topic.")
    sweep: tuple[str, ...] = doc((), "FIELD=V1,V2,... per swept threshold (streams.success_threshold, "
                                 "streams.window, streams.rare_threshold, streams.pattern_length): the "
                                 "counts of every set of their product, in one pass of the SQL engine.")
    against_run: str | None = doc(None, "A run in the archive: which of its live signals these thresholds "
                                  "would not raise, which they would add, and what descends from the dropped.")
    report: Path | None = doc(None, "Directory for the sweep's or the run comparison's tables and plots.")

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
        if self.sql and not self.sweep and bool(self.inputs) == bool(self.clickhouse):  # a sweep checks its own
            raise ConfigError("--engine sql reads either --input FILES (embedded chDB) or --clickhouse URL "
                              "(the archive)")
        if (self.sweep or self.against_run) and (self.publish or self.compare):
            raise ConfigError("--sweep and --against-run neither publish nor compare: drop --publish and --compare")
        if self.sweep:
            if sum(map(bool, (self.inputs, self.bootstrap, self.clickhouse))) != 1:
                raise ConfigError("--sweep reads one source: --input FILES, --bootstrap HOST:PORT (the topics) or "
                                  "--clickhouse URL (the archive)")
            self.swept()
        if self.against_run is not None:
            if self.sweep:
                raise ConfigError("--against-run takes one threshold set: give it with --success-threshold, "
                                  "--window, --rare-threshold and --pattern-length, not --sweep")
            if not self.clickhouse or self.inputs or self.bootstrap:
                raise ConfigError("--against-run reads the run's lineage from the archive: give --clickhouse URL "
                                  "(or set CLICKHOUSE_URL) and no --input or --bootstrap")
            if not self.against_run.strip():
                raise ConfigError("--against-run: give a run id (`coevolve analyze` lists the archived runs)")

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

    def thresholds(self, base: Thresholds = Thresholds()) -> Thresholds:
        """`base` with the thresholds this config sets."""
        given = {f: getattr(self, f) for f in ("success_threshold", "window", "rare_threshold", "pattern_length")}
        return replace(base, **{f: v for f, v in given.items() if v is not None})

    def swept(self) -> Sweep:
        try:
            return parse_sweep(list(self.sweep), self.thresholds())
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def limits(self) -> EvidenceLimits:
        return EvidenceLimits()
