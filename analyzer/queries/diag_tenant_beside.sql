-- The lighter tenants' requests by whether the heavy tenants had requests in flight on their
-- instance when they arrived (`heavy_in_flight`): their wait for the first token and queue.
WITH {heavy_in_flight}
SELECT
    in_flight > 0                                               AS beside,
    count(*)                                                    AS n,
    median(wait)                                                AS wait_p50,
    median(queue_ms)                                            AS queue_p50,
    sum(e2e_ms)                                                 AS e2e_total,
    median(in_flight)                                           AS in_flight_p50
FROM light_beside
GROUP BY beside
