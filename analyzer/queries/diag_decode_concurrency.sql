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
-- every request's start (+1) and end (-1) of computing
edges AS (
    SELECT start_ns + CAST((ttft_ms - prefill_ms) * 1e6 AS BIGINT) AS at_ns, 1::TINYINT AS step
    FROM req WHERE ttft_ms IS NOT NULL
    UNION ALL
    SELECT start_ns + CAST((ttft_ms + decode_ms) * 1e6 AS BIGINT), -1::TINYINT
    FROM req WHERE ttft_ms IS NOT NULL
),
-- How many were computing at a middle: the starts before it less the ends at or before
-- it (a start at that very instant is not yet computing, an end is done).  Counted per
-- second of the window (a running sum over the seconds), then within the middle's own
-- second (a hash join on the second): the same counts as a running sum over every edge
-- and middle in time order, which sorted twice the window's requests (4.4 CPU-s at 10 M
-- requests, this 1.5); a range join of the middles against the requests' spans pairs each
-- stream with everything in flight (~13 s at 1 M).
per_second AS (
    SELECT second, sum(net) AS net FROM (
        SELECT at_ns // 1000000000 AS second, sum(step) AS net FROM edges GROUP BY ALL
        UNION ALL
        SELECT DISTINCT mid_ns // 1000000000, 0 FROM streams
    )
    GROUP BY second
),
before AS (
    SELECT second,
           coalesce(sum(net) OVER (ORDER BY second ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS net
    FROM per_second
),
inside AS (
    SELECT s.stream, sum(e.step) AS net
    FROM streams s JOIN edges e ON e.at_ns // 1000000000 = s.mid_ns // 1000000000
    WHERE e.at_ns < s.mid_ns OR (e.step = -1 AND e.at_ns = s.mid_ns)
    GROUP BY s.stream
),
beside AS (
    SELECT s.stream, s.tpot_ms, b.net + coalesce(i.net, 0) AS running
    FROM streams s JOIN before b ON b.second = s.mid_ns // 1000000000
    LEFT JOIN inside i ON i.stream = s.stream
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
