-- As itl_histogram, when the window is only a time range (or everything): no join needed,
-- itl_hist carries start_ns.  Parameters: start_ns lower bound or NULL, upper bound or NULL.
SELECT {bucket_sums}
FROM itl_hist h
WHERE (?::BIGINT IS NULL OR h.start_ns >= ?) AND (?::BIGINT IS NULL OR h.start_ns < ?)
