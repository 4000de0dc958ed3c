-- What the window's requests carry: the signals each complaint's defining contrast needs
-- (diagnosis/coverage.py).  A row stored before `token_times_source` existed says where its
-- token times came from through its flags and convention.
-- Counts are count_if (coalesced: it is NULL over no rows) and the rest skip '' by nullif,
-- not `FILTER (WHERE ...)`: DuckDB 1.5 runs a filtered aggregate apart, and this query's
-- fifteen cost 0.80 CPU-s at 10 M requests against 0.53 (the same figures).
WITH r AS (
    SELECT *, coalesce(
        token_times_source,
        CASE WHEN list_contains(flags, 'no_token_times') THEN 'none'
             WHEN source = 'genai_client' THEN 'client' ELSE 'server' END
    ) AS times_from
    FROM req
)
SELECT
    count(*)                                                    AS requests,
    coalesce(count_if(times_from = 'server'), 0)                AS token_times_server,
    coalesce(count_if(times_from = 'client'), 0)                AS token_times_client,
    coalesce(count_if(times_from NOT IN ('server', 'client')), 0) AS token_times_none,
    coalesce(count_if(itl_p50_ms IS NOT NULL AND output_tokens >= 3), 0) AS streams,
    count(network_ms)                                           AS client_spans,
    coalesce(count_if(list_contains(flags, 'server_unseen')), 0) AS server_unseen,
    count(prompt_tokens)                                        AS prompt_tokens,
    coalesce(count_if(coalesce(ttft_ms, ttft_client_ms) IS NOT NULL
                      AND NOT list_contains(flags, 'server_unseen')), 0) AS server_first_token,
    count(DISTINCT nullif(tenant, ''))                          AS tenants,
    list_filter(list(DISTINCT tenant ORDER BY tenant), t -> t <> '')[1:3] AS tenant_names,
    count(DISTINCT CASE WHEN instance <> '' THEN (service, instance) END) AS instances,
    coalesce(count_if(cold_start), 0)                           AS cold_marked,
    histogram(nullif(environment, ''))                          AS environments,
    histogram(traffic_class)                                    AS traffic_classes
FROM r
