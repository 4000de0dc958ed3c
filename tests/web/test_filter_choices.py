"""The filter drop-downs' choices: most requests first, ties by name, so the page lists them
in one order every time (and the 200 it keeps are the same 200)."""

from __future__ import annotations

import random

import duckdb

from tokentrace.web._overview import filter_choices


def test_choices_come_most_requests_first_then_by_name() -> None:
    conn = duckdb.connect()
    conn.execute("CREATE TABLE requests (model VARCHAR, tenant VARCHAR, service VARCHAR)")
    # tenants t000..t299 once each and "big" three times, inserted in a shuffled order
    tenants = [f"t{i:03d}" for i in range(300)] + ["big"] * 3
    random.Random(5).shuffle(tenants)
    conn.executemany("INSERT INTO requests VALUES ('m', ?, 'svc')", [[t] for t in tenants])
    choices = filter_choices(conn)
    assert choices["model"] == ["m"] and choices["service"] == ["svc"]
    assert choices["tenant"] == ["big", *(f"t{i:03d}" for i in range(199))]
