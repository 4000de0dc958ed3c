-- big_tenants_slower's first check: the heavy tenants (list ?) and the rest, class ? or all,
-- counted per bucket of queue time (? a doubling, tenant_queues.PER_DOUBLING: bucket b holds
-- 2^(b/PER_DOUBLING) ms up to the next; bucket 0 everything below 2^(1/PER_DOUBLING) ms),
-- with their E2E time.  Where the counts
-- place both groups' queue p95 below the bar, or within MIN_QUEUE_RATIO of each other, the
-- queue contrast is ruled out without diag_tenant_groups' quantiles: 0.26 CPU-s at 10 M
-- requests against 0.6 (log2 is most of it: a plain count of the two groups costs 0.07).
-- Counted in diag_slice_mix's pass as a second grouping set it cost more (0.64 against 0.35
-- + 0.27 apart); linear buckets sized from the tenants' mean queue would save 0.04.
SELECT
    list_contains(?, tenant)                                    AS heavy,
    floor(log2(greatest(queue_ms, 1.0)) * ?)                    AS bucket,
    count(*)                                                    AS n,
    sum(e2e_ms)                                                 AS e2e_total
FROM req
WHERE tenant <> '' AND (? IS NULL OR traffic_class = ?)
GROUP BY ALL
