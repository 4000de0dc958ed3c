-- What the window's requests carry: the signals each complaint's defining contrast needs
-- (diagnosis/coverage.py).  A row stored before `token_times_source` existed says where its
-- token times came from through its flags and convention.
-- Counted per tenant, class, environment, service and instance first (a few hundred rows),
-- then those added up: the DISTINCT counts and the histograms over every request were most
-- of this query (0.52 CPU-s at 10 M requests; counted per group 0.45).  Counts only, so the
-- figures are the same in any order.  (Folding diag_overview's numbers into this pass saved
-- nothing in the file: 0.60 as a second grouping set or summed per group, 0.73 summed per
-- group as integers, against 0.45 + 0.18 apart; summed per group, its float sums differ from
-- a lake's in their last digits.  Over a lake it may save part of the overview's own 0.30
-- CPU-s: not measured.)
-- Counts are count_if, not `FILTER (WHERE ...)`: DuckDB 1.5 runs a filtered aggregate apart
-- (fifteen cost 0.80 CPU-s against 0.53, the same figures).
WITH r AS (
    SELECT *, coalesce(
        token_times_source,
        CASE WHEN list_contains(flags, 'no_token_times') THEN 'none'
             WHEN source = 'genai_client' THEN 'client' ELSE 'server' END
    ) AS times_from
    FROM req
),
g AS (
    SELECT
        tenant, traffic_class, environment, service, instance,
        count(*)                                                AS n,
        count_if(times_from = 'server')                         AS token_times_server,
        count_if(times_from = 'client')                         AS token_times_client,
        count_if(times_from NOT IN ('server', 'client'))        AS token_times_none,
        count_if(itl_p50_ms IS NOT NULL AND output_tokens >= 3) AS streams,
        count(network_ms)                                       AS client_spans,
        count_if(list_contains(flags, 'server_unseen'))         AS server_unseen,
        count(prompt_tokens)                                    AS prompt_tokens,
        count_if(coalesce(ttft_ms, ttft_client_ms) IS NOT NULL
                 AND NOT list_contains(flags, 'server_unseen')) AS server_first_token,
        count_if(cold_start)                                    AS cold_marked,
        min(start_ns)                                           AS first_ns,
        max(start_ns)                                           AS last_ns
    FROM r
    GROUP BY ALL
),
-- each instance's first and last arrival, which the in-flight first checks start from
-- (in_flight_gaps.sql `light_ends`): two BIGINT aggregates here, not a scan of their own
instance_arrivals AS (
    SELECT list({'service': service, 'instance': instance, 'first_ns': first_ns, 'last_ns': last_ns}
                ORDER BY service, instance) AS l
    FROM (SELECT service, instance, min(first_ns) AS first_ns, max(last_ns) AS last_ns
          FROM g GROUP BY service, instance)
),
-- how many requests of each environment (but none) and class, as `histogram` gives them
environments AS (
    SELECT map(list(environment ORDER BY environment), list(n ORDER BY environment)) AS m
    FROM (SELECT environment, sum(n)::UBIGINT AS n FROM g WHERE environment <> '' GROUP BY 1)
    HAVING count(*) > 0
),
classes AS (
    SELECT map(list(traffic_class ORDER BY traffic_class), list(n ORDER BY traffic_class)) AS m
    FROM (SELECT traffic_class, sum(n)::UBIGINT AS n FROM g GROUP BY 1)
    HAVING count(*) > 0
)
SELECT
    coalesce(sum(n), 0)::BIGINT                                 AS requests,
    coalesce(sum(token_times_server), 0)::BIGINT                AS token_times_server,
    coalesce(sum(token_times_client), 0)::BIGINT                AS token_times_client,
    coalesce(sum(token_times_none), 0)::BIGINT                  AS token_times_none,
    coalesce(sum(streams), 0)::BIGINT                           AS streams,
    coalesce(sum(client_spans), 0)::BIGINT                      AS client_spans,
    coalesce(sum(server_unseen), 0)::BIGINT                     AS server_unseen,
    coalesce(sum(prompt_tokens), 0)::BIGINT                     AS prompt_tokens,
    coalesce(sum(server_first_token), 0)::BIGINT                AS server_first_token,
    count(DISTINCT nullif(tenant, ''))                          AS tenants,
    list_filter(list(DISTINCT tenant ORDER BY tenant), t -> t <> '')[1:3] AS tenant_names,
    count(DISTINCT CASE WHEN instance <> '' THEN (service, instance) END) AS instances,
    coalesce(sum(cold_marked), 0)::BIGINT                       AS cold_marked,
    (SELECT m FROM environments)                                AS environments,
    (SELECT m FROM classes)                                     AS traffic_classes,
    (SELECT l FROM instance_arrivals)                           AS instance_arrivals
FROM g
