-- Inter-token gaps of the filtered requests, summed per histogram bucket.
SELECT b.bucket - 1 AS bucket, sum(b.n)::BIGINT AS n
FROM (
    SELECT unnest(h.counts) AS n, generate_subscripts(h.counts, 1) AS bucket
    FROM itl_hist h
    SEMI JOIN req ON req.trace_id = h.trace_id AND req.request_id = h.request_id
) b
WHERE b.n > 0
GROUP BY b.bucket
ORDER BY b.bucket
