-- The lighter tenants' requests that arrived while the heavy tenants had requests in flight
-- on their instance (`heavy_in_flight`), longest wait for the first token first.
WITH {heavy_in_flight},
affected AS (SELECT * FROM light_beside WHERE in_flight > 0)
SELECT trace_id, kept, (SELECT count(*) FROM affected) AS matched FROM affected
ORDER BY wait DESC, trace_id LIMIT 5000
