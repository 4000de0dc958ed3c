-- Traces that matched no span convention, from ? to ? (NULL: unbounded) and of the report's
-- service where it has one (? twice): how many, by the name of their root span.
SELECT root_name, count(*) AS n
FROM unmatched_traces
WHERE (? IS NULL OR start_ns >= ?) AND (? IS NULL OR start_ns < ?) AND (? IS NULL OR service = ?)
GROUP BY root_name
ORDER BY n DESC, root_name
