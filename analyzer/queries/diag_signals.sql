-- What the window's requests carry: the signals each complaint's defining contrast needs
-- (diagnosis/coverage.py).  A row stored before `token_times_source` existed says where its
-- token times came from through its flags and convention.
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
    count(*) FILTER (WHERE times_from = 'server')               AS token_times_server,
    count(*) FILTER (WHERE times_from = 'client')               AS token_times_client,
    count(*) FILTER (WHERE times_from NOT IN ('server', 'client')) AS token_times_none,
    count(*) FILTER (WHERE itl_p50_ms IS NOT NULL AND output_tokens >= 3) AS streams,
    count(*) FILTER (WHERE network_ms IS NOT NULL)              AS client_spans,
    count(*) FILTER (WHERE list_contains(flags, 'server_unseen')) AS server_unseen,
    count(*) FILTER (WHERE prompt_tokens IS NOT NULL)           AS prompt_tokens,
    count(*) FILTER (WHERE coalesce(ttft_ms, ttft_client_ms) IS NOT NULL
                     AND NOT list_contains(flags, 'server_unseen')) AS server_first_token,
    count(DISTINCT tenant) FILTER (WHERE tenant <> '')          AS tenants,
    list(DISTINCT tenant ORDER BY tenant) FILTER (WHERE tenant <> '')[1:3] AS tenant_names,
    count(DISTINCT (service, instance)) FILTER (WHERE instance <> '') AS instances,
    count(*) FILTER (WHERE cold_start)                          AS cold_marked,
    histogram(environment) FILTER (WHERE environment <> '')     AS environments,
    histogram(traffic_class)                                    AS traffic_classes
FROM r
