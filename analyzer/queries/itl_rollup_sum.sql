-- The window's ITL histogram over the minutes the rollup holds whole: {bucket_sums} is
-- sum(r.counts[1]), … one per bucket (the schema's fixed count), {slice_where} the
-- filters' slice (fixed column names, values bound).  Parameters: the minutes (a list).
SELECT {bucket_sums}
FROM itl_rollup r
WHERE list_contains(?::BIGINT[], r.minute_ns) {slice_where}
