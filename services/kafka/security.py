"""How the Kafka clients authenticate and encrypt: one frozen dataclass, the same for every client.

`KafkaSecurity` is configuration like any service's (`runtime.config`): `KAFKA_SECURITY_PROTOCOL`,
`KAFKA_SASL_USERNAME`, ... from the environment, the defaults otherwise. The default is PLAINTEXT
with no credentials, what the embedded broker (`coevolve run`, loopback only) and the local overlay
speak. The production overlay sets SASL_SSL with SCRAM-SHA-512: the password from the service's
KafkaUser Secret, the cluster CA as a file (docs/deploy.md, "Kafka users and ACLs").

Every client takes a `security` argument; left out, it is `KafkaSecurity.from_environment()`, the
bare `KAFKA_*` names of the process environment, so that every client of a process (a service's
producer, consumers and end-offset probes, the signal worker's Faust app) speaks as the same user.
`KafkaSecurity.of("validator")` layers `VALIDATOR_KAFKA_*` over them for a caller that passes it.

Two renderings of the same settings: `kafka_python_options()` (kwargs of kafka-python's producer,
consumer and admin client) and `faust_credentials()` (Faust's `broker_credentials`, which it hands
to aiokafka). An invalid combination fails at load, and a missing certificate file when a client is
built, each with a ConfigError that says what to set.
"""
from __future__ import annotations

import dataclasses
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coevolve.services.runtime.config import ConfigError, doc, load

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True)
class KafkaSecurity:
    kafka_security_protocol: str = doc("PLAINTEXT", "How clients talk to the brokers: PLAINTEXT, SSL, "
                                       "SASL_PLAINTEXT or SASL_SSL.")
    kafka_sasl_mechanism: str = doc("SCRAM-SHA-512", "SASL mechanism (SASL_* protocols): PLAIN, SCRAM-SHA-256 "
                                    "or SCRAM-SHA-512.")
    kafka_sasl_username: str = doc("", "SASL user name (SASL_* protocols): the service's KafkaUser.")
    kafka_sasl_password: str = doc("", "SASL password (SASL_* protocols), from the KafkaUser's Secret.")
    kafka_ssl_cafile: str = doc("", "PEM file of the CA that signed the brokers' certificates (SSL, SASL_SSL); "
                                "empty: the system's trust store.")
    kafka_ssl_certfile: str = doc("", "PEM file of the client's certificate, for mutual TLS (with the key file).")
    kafka_ssl_keyfile: str = doc("", "PEM file of the client's private key, for mutual TLS (with the cert file).")
    kafka_ssl_check_hostname: bool = doc(True, "Check that a broker's certificate names the host connected to.")

    def __post_init__(self) -> None:
        protocol = self.kafka_security_protocol
        if protocol not in PROTOCOLS:
            raise ConfigError(f"KAFKA_SECURITY_PROTOCOL={protocol!r}: use one of {', '.join(PROTOCOLS)}")
        if self.sasl:
            self._check_sasl()
        elif self.kafka_sasl_username or self.kafka_sasl_password:
            raise ConfigError(f"KAFKA_SASL_USERNAME/PASSWORD are set but KAFKA_SECURITY_PROTOCOL={protocol} sends "
                              "no credentials: set KAFKA_SECURITY_PROTOCOL=SASL_SSL, or unset them")
        files = (self.kafka_ssl_cafile, self.kafka_ssl_certfile, self.kafka_ssl_keyfile)
        if not self.tls and any(files):
            raise ConfigError(f"KAFKA_SSL_* files are set but KAFKA_SECURITY_PROTOCOL={protocol} uses no TLS: set "
                              "SSL or SASL_SSL, or unset them")
        if bool(self.kafka_ssl_certfile) != bool(self.kafka_ssl_keyfile):
            raise ConfigError("mutual TLS needs both KAFKA_SSL_CERTFILE and KAFKA_SSL_KEYFILE (a Strimzi TLS "
                              "KafkaUser's Secret holds them as user.crt and user.key); set both or neither")

    def _check_sasl(self) -> None:
        if self.kafka_sasl_mechanism not in MECHANISMS:
            raise ConfigError(f"KAFKA_SASL_MECHANISM={self.kafka_sasl_mechanism!r}: use one of {', '.join(MECHANISMS)}")
        if not self.kafka_sasl_username or not self.kafka_sasl_password:
            raise ConfigError(f"KAFKA_SECURITY_PROTOCOL={self.kafka_security_protocol} needs KAFKA_SASL_USERNAME and "
                              "KAFKA_SASL_PASSWORD: the service's KafkaUser name and the `password` key of the "
                              "Secret Strimzi creates under that name")

    @classmethod
    def of(cls, service: str, environ: Mapping[str, str] | None = None) -> "KafkaSecurity":
        """`SERVICE_KAFKA_*`, then `KAFKA_*`, then the defaults (runtime.config's layering)."""
        return load(cls, service, environ=environ)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> "KafkaSecurity":
        """The bare `KAFKA_*` names only: what every client of the process reads unless given its own."""
        environ = os.environ if environ is None else environ
        names = {f.name.upper() for f in dataclasses.fields(cls)}
        return load(cls, "kafka", environ={k: v for k, v in environ.items() if k in names})

    @property
    def sasl(self) -> bool:
        return self.kafka_security_protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.kafka_security_protocol in ("SSL", "SASL_SSL")

    def _require_files(self) -> None:
        """Fail at start, not at the first connection, when a certificate file is missing."""
        for name in ("kafka_ssl_cafile", "kafka_ssl_certfile", "kafka_ssl_keyfile"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise ConfigError(f"{name.upper()}={path}: no such file; mount it (in Kubernetes: the Secret "
                                  "volume of docs/deploy.md) or point the variable at it")

    def kafka_python_options(self) -> dict[str, Any]:
        """Keyword arguments for kafka-python's KafkaProducer, KafkaConsumer and KafkaAdminClient."""
        self._require_files()
        options: dict[str, Any] = {"security_protocol": self.kafka_security_protocol}
        if self.sasl:
            options.update(sasl_mechanism=self.kafka_sasl_mechanism, sasl_plain_username=self.kafka_sasl_username,
                           sasl_plain_password=self.kafka_sasl_password)
        if self.tls:
            options["ssl_check_hostname"] = self.kafka_ssl_check_hostname
            options.update({key: getattr(self, f"kafka_{key}") for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile")
                            if getattr(self, f"kafka_{key}")})
        return options

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of SSL and SASL_SSL (None otherwise): the CA file or the system's, the client's
        certificate for mutual TLS."""
        if not self.tls:
            return None
        self._require_files()
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.kafka_ssl_cafile or None)
        context.check_hostname = self.kafka_ssl_check_hostname
        if self.kafka_ssl_certfile:
            context.load_cert_chain(self.kafka_ssl_certfile, self.kafka_ssl_keyfile)
        return context

    def faust_credentials(self) -> Any:
        """Faust's `broker_credentials`: None for PLAINTEXT, else SASLCredentials or SSLCredentials.
        (Imported here: the kafka-python clients need no Faust.)"""
        import faust

        if self.sasl:
            return faust.SASLCredentials(username=self.kafka_sasl_username, password=self.kafka_sasl_password,
                                         mechanism=self.kafka_sasl_mechanism, ssl_context=self.ssl_context())
        if self.tls:
            return faust.SSLCredentials(self.ssl_context())
        return None
