"""The window a report or page looks at: time range, model, tenant, traffic class.

`Filters.cte()` gives the SQL of a CTE named `req` holding the filtered
requests, and its bound parameters; every named query reads from `req`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Filters:
    start_ns: int | None = None
    end_ns: int | None = None
    model: str | None = None
    tenant: str | None = None
    traffic_class: str | None = None
    service: str | None = None

    def where(self) -> tuple[str, list[Any]]:
        """Gives a WHERE clause over `requests` and its parameters."""
        clauses: list[str] = []
        params: list[Any] = []
        if self.start_ns is not None:
            clauses.append("start_ns >= ?")
            params.append(self.start_ns)
        if self.end_ns is not None:
            clauses.append("start_ns < ?")
            params.append(self.end_ns)
        for column in ("model", "tenant", "traffic_class", "service"):
            value = getattr(self, column)
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        return ("WHERE " + " AND ".join(clauses)) if clauses else "", params

    def cte(self) -> tuple[str, list[Any]]:
        where, params = self.where()
        return f"WITH req AS NOT MATERIALIZED (SELECT * FROM requests {where})", params  # noqa: S608 - clause built from fixed column names
