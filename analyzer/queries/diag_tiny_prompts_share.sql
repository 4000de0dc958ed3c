-- tiny_prompts_slow's first check: the bar for a tiny prompt (the window's bottom quarter of
-- prompt sizes, at most ? tokens: `cut_tokens`), how many tiny prompts there are, and the two
-- medians the check reads (as diag_tiny_prompts: the share of their wait for the first token
-- spent on network + queue, and that time).  Two medians of the tiny prompts alone: the
-- medians of diag_tiny_prompts read every request (about 5 CPU-s at 10 M requests, these
-- 0.5 with the bar), and most windows stop here.
-- The bar is the quartile of the prompt sizes capped at ? tokens, the same figure as the
-- quartile capped (a cap keeps the sizes' order) and quicker to pick: the capped sizes repeat.
WITH cut AS (
    SELECT quantile_disc(least(prompt_tokens, ?), 0.25) AS tokens
    FROM req WHERE prompt_tokens IS NOT NULL
),
{first_token_waits},
b AS (
    SELECT wait_ms, greatest(wait_ms - first_compute_ms, 0) AS before_ms
    FROM first_token_waits
    WHERE prompt_tokens <= (SELECT tokens FROM cut)
)
SELECT
    (SELECT tokens FROM cut)                                    AS cut_tokens,
    count(*)                                                    AS n,
    median(before_ms / nullif(wait_ms, 0))                      AS overhead_share,
    median(before_ms)                                           AS overhead_p50
FROM b
