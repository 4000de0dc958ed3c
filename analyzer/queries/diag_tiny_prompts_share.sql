-- tiny_prompts_slow's first check: the bar for a tiny prompt (the window's bottom quarter of
-- prompt sizes, at most ? tokens: `cut_tokens`), how many tiny prompts there are, and how
-- many of them are below the check's bars: a share of their wait for the first token spent
-- on network + queue below ?, that time below ? ms (as diag_tiny_prompts reads them).  A
-- median is below its bar where more than half the values are, so counts rule most windows
-- out; the medians (diag_tiny_prompts) read every request, about 3 CPU-s at 10 M requests,
-- where this check reads 0.2.
-- The bar is the quartile of the prompt sizes capped, the same figure as the quartile
-- capped (a cap keeps the sizes' order) and quicker to pick: the capped sizes repeat.  It is
-- picked from the count of each capped size (a few hundred rows) as quantile_disc picks it,
-- the size of rank ceil(n / 4) counted from 1 (0.28 -> 0.24 CPU-s at 10 M requests).  One
-- pass for the bar and the counts below it (grouped by capped size) cost more, 0.52: it
-- computes every request's wait, not only the tiny prompts'.
WITH sizes AS (
    SELECT least(prompt_tokens, ?) AS tokens, count(*) AS n
    FROM req WHERE prompt_tokens IS NOT NULL
    GROUP BY 1
),
cut AS (
    SELECT min(tokens) AS tokens
    FROM (SELECT tokens, sum(n) OVER (ORDER BY tokens) AS upto, sum(n) OVER () AS total FROM sizes)
    WHERE 4 * upto >= total
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
    count(before_ms / nullif(wait_ms, 0))                       AS shares,
    count(*) FILTER (WHERE before_ms / nullif(wait_ms, 0) < ?)  AS below_share,
    count(*) FILTER (WHERE before_ms < ?)                       AS below_overhead
FROM b
