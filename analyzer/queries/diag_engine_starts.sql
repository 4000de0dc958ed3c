-- The engine start-ups of the window's instances with the requests that started during one
-- or within ? ns after it: when, how long each phase took, how long those requests waited.
SELECT e.service, e.instance, e.start_ns, e.end_ns, e.phases, count(*) AS requests,
       median(coalesce(r.ttft_ms, r.ttft_client_ms, r.e2e_ms)) AS wait_p50
FROM engine_starts e JOIN req r
    ON r.service = e.service AND r.instance = e.instance
   AND r.start_ns BETWEEN e.start_ns AND e.end_ns + ?
GROUP BY ALL
ORDER BY e.start_ns, e.instance
