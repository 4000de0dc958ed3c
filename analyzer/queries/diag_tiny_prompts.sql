-- What the smallest prompts (at most ? tokens: diag_tiny_prompts_share's bar) wait for
-- before their first token, against the rest.  Medians of per-request shares resist a few
-- busy minutes.  `wait_ms` and `first_compute_ms`: first_token_waits.  `before_ms`: the
-- wait less its compute, network + queue before inference starts.  Long answers do not
-- dilute it, as they dilute a share of E2E.
-- `bound`: requests that spend at least half their wait on network + queue; their sums
-- (network + queue + compute = wait, exactly) say where that time goes, and the queue's
-- sums (scheduler wait + tokenize + the rest = queue) which part of the queue it is.
-- The larger prompts' row has only the medians the load check and the evidence read
-- (share, network + queue, queue, scheduler wait): a median of the larger prompts reads
-- most of the window (about 0.5 CPU-s at 10 M requests).
WITH {first_token_waits},
w AS (
    SELECT first_token_waits.*, prompt_tokens <= ? AS tiny FROM first_token_waits
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
    count(*)                                                    AS n,
    median(overhead_share)                                      AS overhead_share,
    median(before_ms)                                           AS overhead_p50,
    median(wait_ms) FILTER (WHERE tiny)                         AS wait_p50,
    median(coalesce(network_ms, 0)) FILTER (WHERE tiny)         AS network_p50,
    median(queue_ms)                                            AS queue_p50,
    median(coalesce(queue_wait_ms, 0))                          AS queue_wait_p50,
    -- zero when the convention does not split the queue (then it is all `other`)
    sum(coalesce(queue_wait_ms, 0) + coalesce(tokenize_ms, 0))  AS queue_split_total,
    median(prefill_ms + decode_ms) FILTER (WHERE tiny)          AS compute_p50,
    median(e2e_ms) FILTER (WHERE tiny)                          AS e2e_p50,
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
FROM s
GROUP BY tiny
