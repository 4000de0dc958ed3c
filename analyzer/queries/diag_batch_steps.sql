-- Batch sizes of the steps interactive requests ran in (steps of unknown size not counted).
WITH st AS (
    SELECT batch_size, unnest(request_ids) AS request_id
    FROM engine_steps WHERE start_ns BETWEEN ? AND ?
)
SELECT count(st.batch_size) AS steps, median(st.batch_size) AS batch_p50, max(st.batch_size) AS batch_max
FROM st SEMI JOIN req ON req.request_id = st.request_id AND req.traffic_class <> 'batch'
