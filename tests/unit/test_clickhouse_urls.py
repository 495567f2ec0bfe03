"""Archive URLs as logs and output show them: credentials become `***`, the rest stays as written."""
import pytest

from coevolve.services.clickhouse.urls import redact_url


@pytest.mark.parametrize(("url", "shown"), [
    ("http://coevolve:s3cret@clickhouse:8123/", "http://***@clickhouse:8123/"),
    ("https://token@ch.example:8443", "https://***@ch.example:8443"),
    ("http://u:p%40ss@ch:8123/x?a=1#top", "http://***@ch:8123/x?a=1#top"),
    ("http://u:a@b@ch:8123/", "http://***@ch:8123/"),  # an unescaped @ in the password
    ("http://ch:8123/?database=coevolve&password=pw&secure=1", "http://ch:8123/?database=coevolve&password=***&secure=1"),
    ("http://ch:8123/?user=a&PWD=pw&access_token=t&api_key=k", "http://ch:8123/?user=a&PWD=***&access_token=***&api_key=***"),
    ("chdb:///abs/.coevolve/clickhouse", "chdb:///abs/.coevolve/clickhouse"),
    ("chdb://memory", "chdb://memory"),
    ("http://ch:8123", "http://ch:8123"),
])
def test_credentials_are_hidden_and_nothing_else_changes(url, shown):
    assert redact_url(url) == shown


def test_an_unparseable_url_is_hidden_whole():
    assert redact_url("http://user:pw@[::1") == "***"
