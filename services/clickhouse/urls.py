"""Archive URLs as they may be shown: a server URL in a cluster carries its password."""
from __future__ import annotations

import re
from urllib.parse import urlsplit

HIDDEN = "***"
# Query parameters whose values are credentials (clickhouse-connect's DSN accepts `password=`).
_SECRET_KEY = re.compile(r"pass|pwd|secret|token|key|auth|credential", re.IGNORECASE)


def redact_url(url: str) -> str:
    """`url` with its user info and password-like query values replaced by `***`, for logs and output."""
    try:
        parts = urlsplit(url)
    except ValueError:  # unparseable (e.g. a bad IPv6 host): show none of it
        return HIDDEN
    shown = url  # edited in place: rebuilding would turn chdb:///dir into chdb:/dir
    if "@" in parts.netloc:
        shown = shown.replace(parts.netloc, f"{HIDDEN}@{parts.netloc.rpartition('@')[2]}", 1)
    if parts.query:
        query = "&".join(_redact_pair(pair) for pair in parts.query.split("&"))
        shown = shown.replace(f"?{parts.query}", f"?{query}", 1)
    return shown


def _redact_pair(pair: str) -> str:
    key, sep, _ = pair.partition("=")
    return f"{key}={HIDDEN}" if sep and _SECRET_KEY.search(key) else pair
