-- Without engine steps, the request-level view of what froze streams: did another request's
-- prefill of ? ms or more, of a large prompt (? tokens or more, where the count is known: a
-- small prompt's prefill is long because it waits in a full batch, not because it blocks
-- one), run on the stream's instance (same service and instance) while it decoded, for
-- stalled streams more often than for smooth ones?
-- Each request is placed by its first token: where the user saw it (`start_ns` is the
-- client's start, `ttft_client_ms` after it), else the server's TTFT after half the network
-- (the wire's two ways are not split), else after the start; its prefill ran the prefill
-- before it, its decode the decode after it.  Clients' clocks may differ by a few ms.
-- Prefills are matched to streams by second (an equality a hash join takes; a join on the
-- range itself pairs every stream with every prefill of its instance): a stream looks at
-- the seconds from its decode's start less the longest such prefill to its decode's end.
-- `placed` is not materialized: `big` and `streams` each read only their requests' columns
-- (a copy of every request with its ids cost more than the rest of the query), and the
-- stream sample, drawn on the table's scan, is the same from run to run (drawn on a
-- materialized copy, it changed with the threads' order).  A stream meets a prefill in one
-- second at most (the prefill's start), so the pairs need no DISTINCT.
WITH placed AS NOT MATERIALIZED (
    SELECT trace_id, request_id, service, instance, prompt_tokens, prefill_ms,
           itl_p50_ms IS NOT NULL AND output_tokens >= 3 AS stream,
           coalesce(stall_count, 0) > 0 AS stalled,
           start_ns + CAST(coalesce(
               ttft_client_ms, coalesce(network_ms, 0) / 2 + ttft_ms, prefill_ms
           ) * 1e6 AS BIGINT) AS first_ns,
           CAST(prefill_ms * 1e6 AS BIGINT) AS prefill_ns,
           CAST(decode_ms * 1e6 AS BIGINT) AS decode_ns
    FROM req
),
big AS MATERIALIZED (
    SELECT trace_id, request_id, service, instance, prompt_tokens, prefill_ms,
           first_ns - prefill_ns AS p0, first_ns AS p1, (first_ns - prefill_ns) // 1000000000 AS second
    FROM placed WHERE prefill_ms >= ? AND (prompt_tokens IS NULL OR prompt_tokens >= ?)
),
streams AS MATERIALIZED (
    SELECT trace_id, request_id, service, instance, stalled, first_ns AS d0, first_ns + decode_ns AS d1
    FROM placed WHERE stream
    USING SAMPLE reservoir(4000 ROWS) REPEATABLE (7)
),
stream_second AS (
    SELECT *, unnest(range(
        (d0 - coalesce((SELECT max(p1 - p0) FROM big), 0)) // 1000000000, d1 // 1000000000 + 1
    )) AS second
    FROM streams
),
pairs AS (
    SELECT s.trace_id, s.request_id, s.stalled,
           b.trace_id AS b_trace, b.request_id AS b_request, b.prefill_ms, b.prompt_tokens
    FROM stream_second s JOIN big b
        ON b.service = s.service AND b.instance = s.instance AND b.second = s.second
    WHERE b.p0 < s.d1 AND b.p1 > s.d0 AND NOT (b.trace_id = s.trace_id AND b.request_id = s.request_id)
),
per_stream AS (
    SELECT s.stalled, count(p.b_trace) > 0 AS overlapped
    FROM streams s LEFT JOIN pairs p ON p.trace_id = s.trace_id AND p.request_id = s.request_id
    GROUP BY s.trace_id, s.request_id, s.stalled
),
beside_stalls AS (
    SELECT DISTINCT b_trace, b_request, prefill_ms, prompt_tokens FROM pairs WHERE stalled
)
SELECT stalled, count(*) AS n, count(*) FILTER (WHERE overlapped) AS overlapped,
       (SELECT count(*) FROM beside_stalls) AS prefills,
       (SELECT median(prefill_ms) FROM beside_stalls) AS prefill_p50,
       (SELECT median(prompt_tokens) FROM beside_stalls) AS prompt_tokens_p50
FROM per_stream
GROUP BY stalled
