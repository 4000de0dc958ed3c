"""tiny_prompts_slow's bar for a tiny prompt (diag_tiny_prompts_share's `cut_tokens`), picked
from the count of each capped prompt size, held to `quantile_disc` of the capped sizes on
windows drawn at random: sizes above and at the cap, repeated, missing (NULL), one request,
none."""

from __future__ import annotations

import random
from pathlib import Path

from tokentrace.analyzer.diagnosis import tiny_prompts
from tokentrace.analyzer.diagnosis._base import Context
from tokentrace.analyzer.filters import Filters
from tokentrace.store.connection import open_db

CAP = tiny_prompts.MAX_TINY_TOKENS
T0_NS = 1_750_000_000 * 10**9


def _sizes(rng: random.Random) -> list[int | None]:
    n = rng.choice([0, 1, 2, 3, 4, 5, rng.randint(6, 50), rng.randint(50, 3000)])
    pool = [rng.randint(1, 2 * CAP) for _ in range(rng.randint(1, 8))] + [CAP, CAP + 1, None]
    return [rng.choice(pool) if rng.random() < 0.5 else rng.choice([None, rng.randint(0, 3 * CAP)])
            for _ in range(n)]  # fmt: skip


def test_the_bar_is_the_quartile_of_the_capped_sizes(tmp_path: Path) -> None:
    rng = random.Random(7)
    conn = open_db(tmp_path / "w.duckdb")
    cuts: set[object] = set()
    for _ in range(80):
        sizes = _sizes(rng)
        conn.execute("DELETE FROM requests")
        conn.execute(
            """
            INSERT INTO requests BY NAME
            SELECT 'svc' AS service, 'i0' AS instance, printf('%032x', i) AS trace_id,
                   'r' || i AS request_id, ? + i AS start_ns, 900.0 AS e2e_ms, 10.0 AS queue_ms,
                   prompt_tokens, 200.0 AS ttft_ms, 150.0 AS prefill_ms, 700.0 AS decode_ms,
                   890.0 AS server_ms, 10.0 AS queue_wait_ms, 0.0 AS tokenize_ms,
                   0.0 AS other_ms, 'm' AS model, '' AS tenant, 'interactive' AS traffic_class,
                   '' AS environment, '/v1' AS route, false AS cold_start, false AS error,
                   'test' AS source, []::VARCHAR[] AS flags, false AS kept,
                   'dropped' AS sample_reason, 1.0 AS sample_weight
            FROM (SELECT unnest(?::INTEGER[]) AS prompt_tokens, unnest(range(len(?))) AS i)
            """,
            [T0_NS, sizes, sizes],
        )
        picked = Context(conn, Filters()).one("diag_tiny_prompts_share", [CAP, 0.5, 250.0])
        expected = conn.execute(
            "SELECT quantile_disc(least(prompt_tokens, ?), 0.25) FROM requests "
            "WHERE prompt_tokens IS NOT NULL",
            [CAP],
        ).fetchone()
        assert expected is not None
        assert picked["cut_tokens"] == expected[0], sizes
        cuts.add("none" if expected[0] is None else "cap" if expected[0] == CAP else "below")
    assert cuts == {"none", "cap", "below"}
