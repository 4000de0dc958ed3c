-- Shared CTEs: the light requests that arrived while none of the heavy requests were in flight
-- on their instance (same service and instance): `alone`, each light row whose in-flight count
-- (batch_in_flight, heavy_in_flight) would be 0, found without sweeping every light request.
-- A query defines `heavy` (service, instance, s, e: each heavy request's start and end, ns)
-- and `light` (service, instance, t: each light request's arrival, ns, and what it reads)
-- before it includes `{in_flight_gaps}` in its WITH list.
--
-- Why: the sweeps sort every light request with the heavy ones' starts and ends (5-8 CPU-s
-- each at 10 M requests).  Where heavy traffic never stops, the light requests with none in
-- flight are few, and the signals' first checks need only them and counts over the rest.
-- Here only the heavy requests are sorted: a light request has none in flight exactly where it
-- falls in a gap between the heavy requests' closed intervals [s, e] (the sweep counts a start
-- at its own instant before an arrival, an end after it), so the gaps are open intervals:
-- before the first start, between islands of overlapping requests, after the last end, and
-- the whole range on an instance with no heavy request.  `heavy_ends.reversed` counts heavy
-- requests that end before they start (a negative E2E): there the sweep's count is not this
-- cover, and a query's reader must take the sweep instead.
heavy_reach AS (
    SELECT service, instance, max(e) OVER w AS reach, lead(s) OVER w AS next_s
    FROM heavy
    WINDOW w AS (PARTITION BY service, instance ORDER BY s ROWS UNBOUNDED PRECEDING)
),
heavy_ends AS (
    SELECT service, instance, min(s) AS first_s, max(e) AS last_e, count_if(e < s) AS reversed
    FROM heavy GROUP BY service, instance
),
light_ends AS (
    SELECT service, instance, min(t) AS first_t, max(t) AS last_t
    FROM light GROUP BY service, instance
),
-- every gap, clipped to the light requests' own range on the instance: open (lo, hi)
gaps AS (
    SELECT service, instance, greatest(g.lo, l.first_t - 1) AS lo, least(g.hi, l.last_t + 1) AS hi
    FROM (
        SELECT service, instance, reach AS lo, next_s AS hi FROM heavy_reach WHERE next_s > reach
        UNION ALL
        SELECT l.service, l.instance, l.first_t - 1, coalesce(h.first_s, l.last_t + 1)
        FROM light_ends l LEFT JOIN heavy_ends h USING (service, instance)
        UNION ALL
        SELECT service, instance, last_e, NULL FROM heavy_ends
    ) g
    JOIN light_ends l USING (service, instance)
),
-- Each gap is listed in the fixed-width cells of time it touches, so that every light request
-- finds the gap it may fall in by one hash look-up on its own cell (an interval join would
-- compare it with every gap of its instance).  The width keeps the cells to about a million
-- whatever the gaps' lengths.
gap_width AS (
    SELECT greatest(1, coalesce(sum(hi - lo), 0) // 1048576 + 1)::BIGINT AS w
    FROM gaps WHERE hi - lo > 1
),
gap_cells AS (
    SELECT service, instance, lo, hi, unnest(range(lo // w, hi // w + 1)) AS cell
    FROM gaps, gap_width WHERE hi - lo > 1
),
light_cells AS (
    SELECT l.*, l.t // gap_width.w AS cell FROM light l CROSS JOIN gap_width
),
alone AS (
    SELECT l.* EXCLUDE (cell)
    FROM light_cells l
    JOIN gap_cells g USING (service, instance, cell)
    WHERE l.t > g.lo AND l.t < g.hi
)
