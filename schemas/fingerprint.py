"""CRC-64-AVRO (Rabin) fingerprint of a schema's parsing canonical form, per the Avro spec."""
import json
from functools import lru_cache

from fastavro.schema import to_parsing_canonical_form

_EMPTY = 0xC15D213AA4D7A795


@lru_cache(maxsize=1)
def _table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY & -(fp & 1))
        table.append(fp)
    return tuple(table)


def crc64_avro(data: bytes) -> int:
    """Return the 64-bit CRC-64-AVRO fingerprint of `data`."""
    table = _table()
    fp = _EMPTY
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


def canonical_form(schema: dict | str) -> str:
    """Return the Avro parsing canonical form of a schema given as JSON text or a dict."""
    if isinstance(schema, str):
        schema = json.loads(schema)
    return to_parsing_canonical_form(schema)


def schema_fingerprint(schema: dict | str) -> int:
    """Return the CRC-64-AVRO fingerprint of a schema's canonical form."""
    return crc64_avro(canonical_form(schema).encode("utf-8"))
