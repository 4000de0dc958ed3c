-- Shared CTEs: the light requests that arrived while none of the heavy requests were in flight
-- on their instance (same service and instance): `alone`, each light row whose in-flight count
-- (batch_in_flight, heavy_in_flight) would be 0, found without sweeping every light request.
-- A query defines `heavy` (service, instance, s, e: each heavy request's start and end, ns)
-- and `light` (service, instance, t: each light request's arrival, ns, and what it reads)
-- before it includes `{in_flight_gaps}` in its WITH list, and binds Context.instance_arrivals
-- where it does.
--
-- `heavy` is read five times: a query makes it MATERIALIZED (its few narrow columns, once);
-- `light` (every column a query reads, twice as many rows) stays NOT MATERIALIZED.
--
-- Why: the sweeps sort every light request with the heavy ones' starts and ends (5-8 CPU-s
-- each at 10 M requests).  Where heavy traffic never stops, the light requests with none in
-- flight are few, and the signals' first checks need only them and counts over the rest.
-- A light request has none in flight exactly where it falls in a gap between the heavy
-- requests' closed intervals [s, e] (the sweep counts a start at its own instant before an
-- arrival, an end after it), so the gaps are open intervals: before the first start, between
-- islands of overlapping requests, after the last end, and the whole range on an instance
-- with no heavy request.  Not even every heavy request is sorted: time is cut in cells, a cell
-- that a heavy request covers whole holds no gap, and only the heavy requests that start or
-- end in an open cell bound the gaps there (at 10 M requests 1.9 -> 1.2 CPU-s for the heavy
-- tenants' 3.6 M requests, 1.1 -> 0.7 for 1 M batch requests).  `heavy_reversed` counts
-- heavy requests that end before they start (a negative E2E): there the sweep's count is not
-- this cover, and a query's reader must take the sweep instead.
-- Each instance's first and last arrival, of every request of the window (diag_signals'
-- pass: Context.instance_arrivals, four lists bound here), not of the light requests: a scan
-- of them less (at 10 M requests ~0.15 CPU-s in a file, ~0.3 over a lake).  Any range that
-- holds an instance's light requests finds the same ones apart: the gaps are clipped to it,
-- and there are none outside it.
light_ends AS (
    SELECT unnest(?::VARCHAR[]) AS service, unnest(?::VARCHAR[]) AS instance,
           unnest(?::BIGINT[]) AS first_t, unnest(?::BIGINT[]) AS last_t
),
-- The cells: time in fixed-width cells, the same for every instance.  Wide enough that a heavy
-- request covers several whole cells (a quarter of their mean length), and that the light
-- requests' ranges hold at most about a million cells.
cell_width AS (
    SELECT greatest(
               1,
               (SELECT coalesce(avg(e - s), 0) FROM heavy WHERE e >= s) // 4,
               (SELECT coalesce(sum(last_t - first_t + 1), 0) FROM light_ends) // 1048576
           )::BIGINT AS w
),
-- A cell that one heavy request covers whole holds no light request with none in flight.
-- Which cells are covered, from each heavy request's first and last whole cell (+1 and -1 at
-- the cell after, summed per cell: a hash aggregate, no sort of the heavy requests), then a
-- running sum over the few cells where the cover changes.
cover_steps AS (
    SELECT service, instance, cell, sum(d) AS d
    FROM (
        SELECT service, instance, (s + w - 1) // w AS cell, 1 AS d, (e + 1) // w AS past
        FROM heavy, cell_width
        UNION ALL
        SELECT service, instance, (e + 1) // w AS cell, -1 AS d, NULL AS past
        FROM heavy, cell_width
        WHERE (s + w - 1) // w < (e + 1) // w
    )
    WHERE past IS NULL OR cell < past
    GROUP BY service, instance, cell
),
cover_runs AS (
    SELECT service, instance, cell AS first_cell, lead(cell) OVER w AS past_cell,
           sum(d) OVER w AS cover
    FROM cover_steps
    WINDOW w AS (PARTITION BY service, instance ORDER BY cell ROWS UNBOUNDED PRECEDING)
),
-- The cells of the light requests' range on their instance that no heavy request covers
-- whole: before the first step, in runs of cover 0 (the last run, past every step, is one),
-- and all of them on an instance with no step.
open_cells AS (
    SELECT service, instance, unnest(range(lo, hi)) AS cell
    FROM (
        SELECT l.service, l.instance,
               greatest(coalesce(r.first_cell, l.first_t // w), l.first_t // w) AS lo,
               least(coalesce(r.past_cell, l.last_t // w + 1), l.last_t // w + 1) AS hi
        FROM light_ends l CROSS JOIN cell_width
        LEFT JOIN cover_runs r USING (service, instance)
        WHERE r.cover IS NULL OR r.cover = 0
        UNION ALL
        SELECT l.service, l.instance, l.first_t // w, least(f.first_cell, l.last_t // w + 1)
        FROM light_ends l CROSS JOIN cell_width
        JOIN (
            SELECT service, instance, min(first_cell) AS first_cell
            FROM cover_runs GROUP BY service, instance
        ) f USING (service, instance)
    )
    WHERE lo < hi
),
-- Only a heavy request that starts or ends in an open cell can hold a light request there
-- (the cells between its first and last it covers whole); the others are not sorted.  Two
-- IN look-ups OR-ed: DuckDB makes each a mark join, whose hash table is always the open cells
-- (a SEMI JOIN's side is the optimizer's guess: over a lake it hashed the heavy requests,
-- 0.3 CPU-s a join against 0.07), and the heavy requests are read once, not twice.
edge_heavy AS (
    SELECT h.service, h.instance, h.s, h.e
    FROM heavy h CROSS JOIN cell_width
    WHERE (h.service, h.instance, h.s // cell_width.w) IN (SELECT (service, instance, cell) FROM open_cells)
       OR (h.service, h.instance, h.e // cell_width.w) IN (SELECT (service, instance, cell) FROM open_cells)
),
heavy_reach AS (
    SELECT service, instance, max(e) OVER w AS reach, lead(s) OVER w AS next_s
    FROM edge_heavy
    WINDOW w AS (PARTITION BY service, instance ORDER BY s ROWS UNBOUNDED PRECEDING)
),
edge_ends AS (
    SELECT service, instance, min(s) AS first_s, max(e) AS last_e
    FROM edge_heavy GROUP BY service, instance
),
heavy_reversed AS (
    SELECT count(*) FILTER (WHERE e < s) AS n FROM heavy  -- 0 with no heavy request (count_if: NULL)
),
-- every gap between the edge requests, clipped to the light requests' own range on the
-- instance: open (lo, hi)
gaps AS (
    SELECT service, instance, greatest(g.lo, l.first_t - 1) AS lo, least(g.hi, l.last_t + 1) AS hi
    FROM (
        SELECT service, instance, reach AS lo, next_s AS hi FROM heavy_reach WHERE next_s > reach
        UNION ALL
        SELECT l.service, l.instance, l.first_t - 1, coalesce(h.first_s, l.last_t + 1)
        FROM light_ends l LEFT JOIN edge_ends h USING (service, instance)
        UNION ALL
        SELECT service, instance, last_e, NULL FROM edge_ends
    ) g
    JOIN light_ends l USING (service, instance)
),
-- Each gap is listed in the open cells it touches, so that every light request finds the gap
-- it may fall in by one hash look-up on its own cell (an interval join would compare it with
-- every gap of its instance); a light request in a covered cell finds none.
gap_cells AS (
    SELECT g.*
    FROM (
        SELECT service, instance, lo, hi, unnest(range(lo // w, hi // w + 1)) AS cell
        FROM gaps, cell_width WHERE hi - lo > 1
    ) g
    SEMI JOIN open_cells o USING (service, instance, cell)
),
light_cells AS (
    SELECT l.*, l.t // cell_width.w AS cell FROM light l CROSS JOIN cell_width
),
alone AS (
    SELECT l.* EXCLUDE (cell)
    FROM light_cells l
    JOIN gap_cells g USING (service, instance, cell)
    WHERE l.t > g.lo AND l.t < g.hi
)
