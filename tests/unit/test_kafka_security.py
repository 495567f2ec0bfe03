"""KafkaSecurity: layered from the environment like any config, rendered for kafka-python and Faust,
and an invalid combination is a ConfigError that says what to set."""
import ssl
import subprocess

import faust
import pytest

from coevolve.services.kafka.security import KafkaSecurity
from coevolve.services.runtime.config import ConfigError, describe

SCRAM = {"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_USERNAME": "validator", "KAFKA_SASL_PASSWORD": "secret"}


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory):
    """A self-signed CA certificate and its key, as PEM files (openssl, or the test skips)."""
    folder = tmp_path_factory.mktemp("ca")
    try:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
                        "-keyout", str(folder / "ca.key"), "-out", str(folder / "ca.crt")],
                       check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"openssl cannot make a test certificate: {exc}")
    return folder / "ca.crt"


def test_the_default_is_plaintext_without_credentials_for_the_embedded_broker():
    security = KafkaSecurity.from_environment({})
    assert security.kafka_security_protocol == "PLAINTEXT"
    assert security.kafka_python_options() == {"security_protocol": "PLAINTEXT"}
    assert security.faust_credentials() is None and security.ssl_context() is None


def test_every_field_has_a_default_and_a_doc_and_reads_as_a_kafka_variable():
    rows = describe(KafkaSecurity)
    assert all(text for _, _, text in rows)
    assert all(name.startswith("kafka_") for name, _, _ in rows)  # KAFKA_SASL_USERNAME, not SASL_USERNAME


def test_service_variables_layer_over_the_shared_ones():
    env = {**SCRAM, "VALIDATOR_KAFKA_SASL_USERNAME": "validator-2", "EXPLORER_KAFKA_SASL_PASSWORD": "other"}
    assert KafkaSecurity.of("validator", env).kafka_sasl_username == "validator-2"
    assert KafkaSecurity.of("explorer", env).kafka_sasl_password == "other"
    assert KafkaSecurity.of("explorer", env).kafka_sasl_username == "validator"
    # The process default reads the shared names only: every client of a process speaks as one user.
    assert KafkaSecurity.from_environment(env).kafka_sasl_username == "validator"
    assert KafkaSecurity.of("x", {**SCRAM, "KAFKA_SSL_CHECK_HOSTNAME": "false"}).kafka_ssl_check_hostname is False


def test_scram_over_tls_for_kafka_python(ca_file):
    security = KafkaSecurity.from_environment({**SCRAM, "KAFKA_SSL_CAFILE": str(ca_file)})
    assert security.kafka_python_options() == {
        "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "validator",
        "sasl_plain_password": "secret", "ssl_check_hostname": True, "ssl_cafile": str(ca_file)}


def test_the_options_are_ones_kafka_python_takes():
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

    options = KafkaSecurity.from_environment(SCRAM).kafka_python_options()
    for client in (KafkaProducer, KafkaConsumer, KafkaAdminClient):
        assert set(options) <= set(client.DEFAULT_CONFIG), client.__name__


def test_scram_over_tls_for_faust(ca_file):
    credentials = KafkaSecurity.from_environment({**SCRAM, "KAFKA_SSL_CAFILE": str(ca_file)}).faust_credentials()
    assert isinstance(credentials, faust.SASLCredentials)
    assert (credentials.username, credentials.password) == ("validator", "secret")
    assert credentials.mechanism.value == "SCRAM-SHA-512" and credentials.protocol.value == "SASL_SSL"
    assert credentials.ssl_context.verify_mode == ssl.CERT_REQUIRED and credentials.ssl_context.check_hostname
    assert any(ca["subject"] == ((("commonName", "test-ca"),),) for ca in credentials.ssl_context.get_ca_certs())


def test_faust_hands_the_credentials_to_aiokafka():
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    sasl = KafkaSecurity.from_environment({**SCRAM, "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"})
    auth = credentials_to_aiokafka_auth(sasl.faust_credentials())
    assert auth == {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512",
                    "sasl_plain_username": "validator", "sasl_plain_password": "secret", "ssl_context": None}


def test_mutual_tls_gives_faust_an_ssl_context_with_the_client_certificate(ca_file):
    env = {"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CAFILE": str(ca_file),
           "KAFKA_SSL_CERTFILE": str(ca_file), "KAFKA_SSL_KEYFILE": str(ca_file.with_name("ca.key"))}
    security = KafkaSecurity.from_environment(env)
    assert isinstance(security.faust_credentials(), faust.SSLCredentials)
    options = security.kafka_python_options()
    assert options["security_protocol"] == "SSL" and options["ssl_keyfile"].endswith("ca.key")
    assert "sasl_mechanism" not in options


@pytest.mark.parametrize(("env", "match"), [
    ({"KAFKA_SECURITY_PROTOCOL": "TLS"}, "use one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
    ({"KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "needs KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD"),
    ({**SCRAM, "KAFKA_SASL_PASSWORD": ""}, "needs KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD"),
    ({**SCRAM, "KAFKA_SASL_MECHANISM": "GSSAPI"}, "use one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
    ({"KAFKA_SASL_USERNAME": "validator"}, "sends no credentials: set KAFKA_SECURITY_PROTOCOL=SASL_SSL"),
    ({"KAFKA_SSL_CAFILE": "/ca.crt"}, "uses no TLS: set SSL or SASL_SSL"),
    ({"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CERTFILE": "/user.crt"}, "needs both KAFKA_SSL_CERTFILE and"),
    ({"KAFKA_SSL_CHECK_HOSTNAME": "maybe"}, "use true or false"),
])
def test_an_invalid_combination_fails_at_load_saying_what_to_set(env, match):
    with pytest.raises(ConfigError, match=match):
        KafkaSecurity.from_environment(env)


def test_a_missing_certificate_file_fails_when_a_client_is_built_not_at_its_first_connection(tmp_path):
    security = KafkaSecurity.from_environment({**SCRAM, "KAFKA_SSL_CAFILE": str(tmp_path / "ca.crt")})
    for build in (security.kafka_python_options, security.faust_credentials):
        with pytest.raises(ConfigError, match="KAFKA_SSL_CAFILE=.*ca.crt: no such file; mount it"):
            build()


def test_the_clients_take_the_security_and_fail_before_connecting():
    from coevolve.services.kafka.consumer import EventConsumer
    from coevolve.services.kafka.producer import EventProducer
    from coevolve.services.kafka.topics import create_topics

    missing = KafkaSecurity.from_environment({**SCRAM, "KAFKA_SSL_CAFILE": "/nonexistent/ca.crt"})
    for build in (lambda: EventProducer("127.0.0.1:1", security=missing),
                  lambda: EventConsumer("127.0.0.1:1", ["coevolve.tasks"], security=missing),
                  lambda: create_topics("127.0.0.1:1", security=missing)):
        with pytest.raises(ConfigError, match="no such file"):
            build()


def test_the_signal_workers_faust_app_gets_the_credentials():
    from coevolve.streams.worker.app import new_app
    from coevolve.streams.worker.config import StreamsConfig

    app = new_app(StreamsConfig(), KafkaSecurity.from_environment({**SCRAM, "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"}))
    assert isinstance(app.conf.broker_credentials, faust.SASLCredentials)
    assert app.conf.broker_credentials.username == "validator"
    assert new_app(StreamsConfig()).conf.broker_credentials is None  # PLAINTEXT, as the embedded broker
