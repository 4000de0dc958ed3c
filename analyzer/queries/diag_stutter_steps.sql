-- Did large prefill steps (>= ? tokens) run during the decode of stalled streams, more
-- than during smooth ones?  A step counts only for the streams of its own engine
-- (`request_engine`: the stream's instance, or the engine process whose steps name it):
-- another replica's prefill at the same moment froze nobody here.
-- The decode window is the server's own, first token to last, on the engine's clock: a
-- step after the last token froze nothing, though the answer may still be on its way to
-- the user.  `start_ns` is the client span's start where there is one (the network's way
-- in, unknown, lies between it and the server's), so:
--   * no client span: the row is the server's, [start + TTFT, start + TTFT + decode];
--   * a client span and engine steps that name the stream: its last token ends the last
--     step naming it, and the window is [that − decode, that];
--   * a client span and no step naming it (TGI's batches): the placement is not stored, and
--     the window covers wherever the server may have started, [start + TTFT, start +
--     network + TTFT + decode], which still leaves out the server's own time after the
--     last token.
WITH asked AS MATERIALIZED (
    SELECT trace_id, request_id, service, instance, stall_count > 0 AS stalled,
           start_ns AS t0, start_ns + CAST(e2e_ms * 1e6 AS BIGINT) AS t1,
           CAST(coalesce(ttft_ms, 0) * 1e6 AS BIGINT) AS ttft_ns,
           CAST(decode_ms * 1e6 AS BIGINT) AS decode_ns,
           CAST(network_ms * 1e6 AS BIGINT) AS network_ns
    FROM req
    WHERE itl_p50_ms IS NOT NULL AND output_tokens >= 3
    USING SAMPLE reservoir(4000 ROWS) REPEATABLE (7)
),
{request_engines},
-- Where a client span's stream can have its last token, on the client's clock: from
-- start + TTFT + decode (the server started at once) to the client's end, ? ns either side
-- for clocks that disagree.  Matched to steps by the second they end in (an equality on
-- a hash join; a join on the range itself pairs every stream with every step of its engine).
last_band AS (
    SELECT trace_id, request_id, service, engine,
           t0 + ttft_ns + decode_ns - ? AS lo, t1 + ? AS hi
    FROM request_engine WHERE network_ns IS NOT NULL
),
last_band_second AS (
    SELECT *, unnest(range(lo // 1000000000, hi // 1000000000 + 1)) AS second FROM last_band
),
last_named AS (
    SELECT b.trace_id, b.request_id, b.engine, max(s.start_ns + s.duration_us * 1000) AS last_ns
    FROM last_band_second b JOIN engine_steps s
        ON s.service = b.service AND s.instance = b.engine
       AND (s.start_ns + s.duration_us * 1000) // 1000000000 = b.second
    WHERE len(s.request_ids) > 0
      -- steps are stored in time order: bounds on the start skip the rest of the table (a
      -- step that ends in a band started less than a minute before it)
      AND s.start_ns BETWEEN (SELECT min(lo) FROM last_band) - 60000000000 AND (SELECT max(hi) FROM last_band)
      AND s.start_ns + s.duration_us * 1000 BETWEEN b.lo AND b.hi
      AND list_contains(s.request_ids, b.request_id)
    GROUP BY ALL
),
decoding AS (
    SELECT e.trace_id, e.service, e.engine,
           CASE WHEN n.last_ns IS NOT NULL THEN n.last_ns - e.decode_ns
                ELSE e.t0 + e.ttft_ns END AS d0,
           CASE WHEN n.last_ns IS NOT NULL THEN n.last_ns
                ELSE e.t0 + coalesce(e.network_ns, 0) + e.ttft_ns + e.decode_ns END AS d1
    FROM request_engine e LEFT JOIN last_named n
        ON n.trace_id = e.trace_id AND n.request_id = e.request_id AND n.engine = e.engine
),
big AS (
    SELECT service, instance, start_ns FROM engine_steps
    WHERE prefill_tokens >= ? AND start_ns BETWEEN ? AND ?
),
hit AS (
    SELECT DISTINCT d.trace_id FROM decoding d JOIN big
        ON big.service = d.service AND big.instance = d.engine
       AND big.start_ns BETWEEN d.d0 AND d.d1
)
SELECT r.stalled, count(*) AS n, count(hit.trace_id) AS overlapped
FROM asked r LEFT JOIN hit ON r.trace_id = hit.trace_id
GROUP BY r.stalled
