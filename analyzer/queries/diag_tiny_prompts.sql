-- What the smallest prompts (bottom quarter, at most ? tokens) wait for before their first
-- token, against the rest.  Medians of per-request shares resist a few busy minutes.
-- `wait_ms`: the user's wait for the first token: TTFT as the client saw it, else network
-- + the server's TTFT, else (no first-token time) the whole E2E.  `first_compute_ms`: the
-- compute inside it (prefill; with no first-token time, prefill + decode).  `before_ms`:
-- the rest, network + queue before inference starts.  Long answers do not dilute it, as
-- they dilute a share of E2E.
-- `bound`: requests that spend at least half their wait on network + queue; their sums
-- (network + queue + compute = wait, exactly) say where that time goes, and the queue's
-- sums (scheduler wait + tokenize + the rest = queue) which part of the queue it is.
WITH cut AS (
    SELECT least(quantile_disc(prompt_tokens, 0.25), ?) AS tokens
    FROM req WHERE prompt_tokens IS NOT NULL
),
w AS (
    SELECT req.*, (req.prompt_tokens <= cut.tokens) AS tiny,
           coalesce(ttft_client_ms, coalesce(network_ms, 0) + ttft_ms, e2e_ms) AS wait_ms,
           CASE WHEN ttft_client_ms IS NULL AND ttft_ms IS NULL THEN prefill_ms + decode_ms
                ELSE prefill_ms END AS first_compute_ms
    FROM req, cut
    WHERE req.prompt_tokens IS NOT NULL AND e2e_ms > 0
),
b AS (
    SELECT w.*, greatest(wait_ms - first_compute_ms, 0) AS before_ms FROM w
),
r AS (
    SELECT b.*,
           before_ms / nullif(wait_ms, 0)                      AS overhead_share,
           least(coalesce(network_ms, 0), before_ms)           AS before_network_ms,
           before_ms >= 0.5 * wait_ms AND wait_ms > 0          AS bound
    FROM b
),
-- the queue's part of the wait (network + queue less the network) split as buckets.md
-- splits the queue: scheduler wait, tokenization, the rest; each clamped into what is
-- left of it, so the three add up to that part exactly
p AS (
    SELECT r.*, before_ms - before_network_ms AS before_queue_ms,
           least(coalesce(queue_wait_ms, 0), before_ms - before_network_ms) AS before_queue_wait_ms
    FROM r
),
s AS (
    SELECT p.*,
           least(coalesce(tokenize_ms, 0), before_queue_ms - before_queue_wait_ms) AS before_tokenize_ms
    FROM p
)
SELECT
    tiny,
    any_value(cut.tokens)                                       AS cut_tokens,
    count(*)                                                    AS n,
    median(overhead_share)                                      AS overhead_share,
    median(before_ms)                                           AS overhead_p50,
    median(wait_ms)                                             AS wait_p50,
    median(coalesce(network_ms, 0))                             AS network_p50,
    median(queue_ms)                                            AS queue_p50,
    median(coalesce(queue_wait_ms, 0))                          AS queue_wait_p50,
    -- zero when the convention does not split the queue (then it is all `other`)
    sum(coalesce(queue_wait_ms, 0) + coalesce(tokenize_ms, 0))  AS queue_split_total,
    median(prefill_ms + decode_ms)                              AS compute_p50,
    median(e2e_ms)                                              AS e2e_p50,
    sum(e2e_ms)                                                 AS e2e_total,
    sum(before_ms)                                              AS before_total,
    count(*) FILTER (WHERE bound)                               AS bound_n,
    count(network_ms) FILTER (WHERE bound)                      AS bound_with_network,
    coalesce(sum(before_network_ms) FILTER (WHERE bound), 0)            AS bound_network_total,
    coalesce(sum(before_ms - before_network_ms) FILTER (WHERE bound), 0) AS bound_queue_total,
    coalesce(sum(wait_ms - before_ms) FILTER (WHERE bound), 0)          AS bound_compute_total,
    coalesce(sum(wait_ms) FILTER (WHERE bound), 0)                      AS bound_wait_total,
    coalesce(sum(before_queue_wait_ms) FILTER (WHERE bound), 0)         AS bound_queue_wait_total,
    coalesce(sum(before_tokenize_ms) FILTER (WHERE bound), 0)           AS bound_tokenize_total
FROM s, cut
GROUP BY tiny
