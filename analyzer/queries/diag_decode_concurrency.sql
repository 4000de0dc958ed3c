-- Where no engine steps say how large the decode batch was: TPOT against how many
-- requests the server was computing at once, counted at the middle of each stream's
-- decode (a sample of streams; every request of the window counts towards "at once").
-- A request is computing from its prefill's start to its last token: start + TTFT less
-- prefill, to start + TTFT + decode.  Times mix the client's start with the server's
-- durations, alike for every request, so the counts hold though the clocks differ.
-- The streams beside the fewest others (bottom quarter) against the most (top quarter).
WITH streams AS MATERIALIZED (
    SELECT row_number() OVER () AS stream, tpot_ms,
           start_ns + CAST((ttft_ms + decode_ms / 2) * 1e6 AS BIGINT) AS mid_ns
    FROM req
    WHERE tpot_ms IS NOT NULL AND ttft_ms IS NOT NULL AND output_tokens >= 3
    USING SAMPLE reservoir(4000 ROWS) REPEATABLE (7)
),
-- every request's start (+1) and end (-1) of computing, and the streams' middles (0), in
-- time order: the running sum at a middle is how many were computing then.  One sort of
-- the window's edges (1 M requests: ~0.5 s on two cores); a range join of the middles
-- against the requests' spans pairs each stream with everything in flight (~13 s).
edges AS (
    SELECT start_ns + CAST((ttft_ms - prefill_ms) * 1e6 AS BIGINT) AS at_ns, 1 AS step,
           NULL::BIGINT AS stream, NULL::DOUBLE AS tpot_ms
    FROM req WHERE ttft_ms IS NOT NULL
    UNION ALL
    SELECT start_ns + CAST((ttft_ms + decode_ms) * 1e6 AS BIGINT), -1, NULL, NULL
    FROM req WHERE ttft_ms IS NOT NULL
    UNION ALL
    SELECT mid_ns, 0, stream, tpot_ms FROM streams
),
beside AS (
    SELECT stream, tpot_ms, running FROM (
        SELECT stream, tpot_ms, sum(step) OVER (ORDER BY at_ns, step ROWS UNBOUNDED PRECEDING) AS running
        FROM edges
    )
    WHERE stream IS NOT NULL
),
q AS (SELECT quantile_disc(running, 0.25) AS lo, quantile_disc(running, 0.75) AS hi FROM beside)
SELECT
    count(*) FILTER (WHERE running <= q.lo)                     AS small_streams,
    min(running) FILTER (WHERE running <= q.lo)                 AS small_running_min,
    max(running) FILTER (WHERE running <= q.lo)                 AS small_running_max,
    median(tpot_ms) FILTER (WHERE running <= q.lo)              AS small_tpot_p50,
    count(*) FILTER (WHERE running >= q.hi)                     AS large_streams,
    min(running) FILTER (WHERE running >= q.hi)                 AS large_running_min,
    max(running) FILTER (WHERE running >= q.hi)                 AS large_running_max,
    median(tpot_ms) FILTER (WHERE running >= q.hi)              AS large_tpot_p50
FROM beside, q
