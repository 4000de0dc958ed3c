-- Bucket shares by prompt size: the smallest prompts (bottom quarter, at most ? tokens)
-- against the rest.  Medians of per-request shares resist a few busy minutes.
-- `bound`: requests that spend at least half their E2E on network + queue; their sums
-- (network + queue + compute = E2E, exactly) say where that time goes.
WITH cut AS (
    SELECT least(quantile_disc(prompt_tokens, 0.25), ?) AS tokens
    FROM req WHERE prompt_tokens IS NOT NULL
),
r AS (
    SELECT req.*, (req.prompt_tokens <= cut.tokens) AS tiny,
           (coalesce(network_ms, 0) + queue_ms) / nullif(e2e_ms, 0) AS overhead_share,
           (coalesce(network_ms, 0) + queue_ms) >= 0.5 * e2e_ms AS bound
    FROM req, cut
    WHERE req.prompt_tokens IS NOT NULL AND e2e_ms > 0
)
SELECT
    tiny,
    any_value(cut.tokens)                                       AS cut_tokens,
    count(*)                                                    AS n,
    median(overhead_share)                                      AS overhead_share,
    median(coalesce(network_ms, 0) + queue_ms)                  AS overhead_p50,
    median(coalesce(network_ms, 0))                             AS network_p50,
    median(queue_ms)                                            AS queue_p50,
    median(coalesce(queue_wait_ms, 0))                          AS queue_wait_p50,
    -- zero when the convention does not split the queue (then it is all `other`)
    sum(coalesce(queue_wait_ms, 0) + coalesce(tokenize_ms, 0))  AS queue_split_total,
    median(prefill_ms + decode_ms)                              AS compute_p50,
    median(e2e_ms)                                              AS e2e_p50,
    sum(e2e_ms)                                                 AS e2e_total,
    count(*) FILTER (WHERE bound)                               AS bound_n,
    count(network_ms) FILTER (WHERE bound)                      AS bound_with_network,
    coalesce(sum(coalesce(network_ms, 0)) FILTER (WHERE bound), 0)  AS bound_network_total,
    coalesce(sum(queue_ms) FILTER (WHERE bound), 0)                 AS bound_queue_total,
    coalesce(sum(prefill_ms + decode_ms) FILTER (WHERE bound), 0)   AS bound_compute_total,
    coalesce(sum(e2e_ms) FILTER (WHERE bound), 0)                   AS bound_e2e_total
FROM r, cut
GROUP BY tiny
