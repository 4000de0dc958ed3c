-- Shared CTEs: a request's engine.  A query includes them as `{request_engines}` in its
-- WITH list, after a CTE `asked` of requests (trace_id, request_id, service, instance, and
-- t0, t1: their lifetime, unix ns).  `request_engine` is `asked` with `engine`, the instance
-- whose engine steps are the request's (one row per engine):
--   * its own instance when that one recorded steps between the first t0 and the last t1
--     (an engine in the same process: two replicas that both count ids "req-1" keep
--     their own steps);
--   * else the instances of its service whose steps name it during its lifetime (an engine
--     in another process of the same service, as vLLM V1's engine core, which has its own
--     service.instance.id);
--   * else its own.
-- Only the second case reads the steps' request ids, and only for such requests.
engine_local AS (
    SELECT DISTINCT service, instance FROM engine_steps
    WHERE start_ns BETWEEN (SELECT min(t0) FROM asked) AND (SELECT max(t1) FROM asked)
),
engine_lookup AS (
    SELECT trace_id, request_id, service, instance, t0, t1
    FROM asked a ANTI JOIN engine_local l ON l.service = a.service AND l.instance = a.instance
),
-- per instance and request id, its first and last step (a join on the lifetimes themselves
-- would make a row of every step of every request)
engine_span AS (
    SELECT s.service, s.instance, s.request_id, min(s.start_ns) AS first_ns, max(s.start_ns) AS last_ns
    FROM (
        -- a join, not a scalar bound: with nothing to look up the steps are not read
        SELECT e.service, e.instance, e.start_ns, unnest(e.request_ids) AS request_id
        FROM engine_steps e JOIN (
            SELECT service, min(t0) AS lo, max(t1) AS hi FROM engine_lookup GROUP BY service
        ) b ON b.service = e.service AND e.start_ns BETWEEN b.lo AND b.hi
    ) s SEMI JOIN engine_lookup a ON a.service = s.service AND a.request_id = s.request_id
    GROUP BY ALL
),
engine_named AS (
    SELECT DISTINCT a.trace_id, a.request_id, a.service, a.instance, a.t0, s.instance AS engine
    FROM engine_lookup a JOIN engine_span s
        ON s.service = a.service AND s.request_id = a.request_id AND s.first_ns <= a.t1 AND s.last_ns >= a.t0
),
request_engine AS (
    SELECT a.*, coalesce(n.engine, a.instance) AS engine
    FROM asked a LEFT JOIN engine_named n
        ON n.trace_id = a.trace_id AND n.request_id = a.request_id AND n.service = a.service
       AND n.instance = a.instance AND n.t0 = a.t0
)
