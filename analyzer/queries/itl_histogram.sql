-- Inter-token gaps of the filtered requests, summed per histogram bucket position.
-- {bucket_sums} expands to sum(h.counts[1]), …, one per bucket (a fixed count from the
-- schema, never input): positional sums scan the lists without unnesting 100 M gaps.
SELECT {bucket_sums}
FROM itl_hist h
SEMI JOIN req ON req.trace_id = h.trace_id AND req.request_id = h.request_id
