-- Live requests by whether batch requests were in flight on their instance when they
-- arrived (request-level: no engine steps or slices needed), and how many.
WITH {batch_in_flight}
SELECT
    (in_flight > 0)                                             AS with_batch,
    count(*)                                                    AS n,
    median(ttft)                                                AS ttft_p50,
    median(tpot_ms)                                             AS tpot_p50,
    median(queue_wait_ms)                                       AS queue_wait_p50,
    sum(e2e_ms)                                                 AS e2e_total,
    median(in_flight)                                           AS in_flight_p50,
    max(in_flight)                                              AS in_flight_max
FROM live_beside
GROUP BY with_batch
