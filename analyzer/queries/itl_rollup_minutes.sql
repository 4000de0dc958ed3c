-- Per minute of the window's request starts: how many requests are stored, and how many
-- the `itl_rollup` rows of the window's slice (the filters' service, model, tenant, traffic
-- class: {slice_where}, fixed column names, values bound) sum.  A minute whose two counts
-- agree is read from the rollup (tokentrace.analyzer.itl_window).  Parameters: the
-- rollup's minute length (ns); the slice's values.
WITH per_minute AS (
    SELECT start_ns - start_ns % ?::BIGINT AS minute_ns, count(*) AS stored
    FROM req
    GROUP BY minute_ns
),
rolled AS (
    SELECT minute_ns, sum(requests) AS rolled
    FROM itl_rollup
    WHERE minute_ns IN (SELECT minute_ns FROM per_minute) {slice_where}
    GROUP BY minute_ns
)
SELECT p.minute_ns, p.stored, coalesce(r.rolled, 0) AS rolled
FROM per_minute p LEFT JOIN rolled r USING (minute_ns)
ORDER BY p.minute_ns
