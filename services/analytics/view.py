"""A view: one analysis as plain rows, with a note when the archive lacks its events."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class View:
    name: str
    title: str
    columns: list[str]
    rows: list[list] = field(default_factory=list)
    note: str = ""

    def as_json(self) -> dict:
        return {"title": self.title, "columns": self.columns, "rows": self.rows, "note": self.note}


def query_rows(client, sql: str, params: dict) -> list[list]:
    """The result of a parameterized query as lists."""
    return [list(r) for r in client.query(sql, parameters=params).result_rows]
