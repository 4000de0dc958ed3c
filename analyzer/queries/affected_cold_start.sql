-- Cold requests (as in diag_cold_start: `cold_set` finds those `cold_requests` flags, from the
-- few requests that can be cold, not by flagging every request), slowest first.
WITH {cold_set}
SELECT trace_id, kept, (SELECT count(*) FROM cold) AS matched FROM cold
ORDER BY wait DESC, trace_id LIMIT 5000
