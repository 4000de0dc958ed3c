-- Who shared batches with whom: steps whose request ids span the heavy tenants (list ?)
-- and the others, joined through requests.request_id.
WITH st AS (
    SELECT row_number() OVER () AS step, batch_size, unnest(request_ids) AS request_id
    FROM engine_steps WHERE start_ns BETWEEN ? AND ? AND len(request_ids) > 1
),
t AS (
    SELECT st.step, any_value(st.batch_size) AS batch_size,
           bool_or(list_contains(?, req.tenant)) AS heavy,
           bool_or(NOT list_contains(?, req.tenant)) AS light
    FROM st JOIN req ON req.request_id = st.request_id
    GROUP BY st.step
)
SELECT count(*) AS steps, count(*) FILTER (WHERE heavy AND light) AS shared,
       avg(batch_size) FILTER (WHERE heavy AND light) AS shared_batch
FROM t
