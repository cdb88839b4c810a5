-- Where the relay's mark costs go, by table layout: the same 20,000 events (1 KiB payload,
-- 150-byte trace header, 1,000 aggregates) appended one per transaction, then drained by a
-- claim of 1,000 in id order with the per-aggregate order check and a mark of those rows,
-- a commit after each mark as the relay's, in three layouts, three interleaved rounds, each
-- load and drain from a CHECKPOINT (BENCHMARKS.md, "The mark: three layouts measured").
-- Commits do not wait for the WAL flush (synchronous_commit = off): what is compared is the
-- database's work, not the disk's fsync.
--
--   psql -h 127.0.0.1 -U postgres -d test -f xtask/sql/mark_layouts.sql
--
-- inline: the outbox as it is (payload in the row; status in the partial indexes' predicates,
--         so a mark is never a HOT update).
-- side:   payload and headers in a table of their own, inserted once; the claim joins it,
--         the mark rewrites a narrow row.
-- queue:  the open rows' state in a narrow table of their own (the status indexes move
--         there), so that the outbox row's mark can be a HOT update (no index on what it
--         changes; fillfactor 50: room for a second version of each row), and the queue row
--         is deleted.
-- Everything runs in the schema mark_layouts, dropped at the end. Planner: no sequential or
-- bitmap scans, as the relay's statements run.
\set ON_ERROR_STOP on
\set QUIET on
\pset footer off
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS mark_layouts CASCADE;
CREATE SCHEMA mark_layouts;
SET search_path = mark_layouts;

CREATE TABLE inline (
    id bigint GENERATED ALWAYS AS IDENTITY, event_id uuid NOT NULL,
    aggregate_type text NOT NULL, aggregate_id text NOT NULL, aggregate_version bigint,
    event_type text NOT NULL, schema_version integer NOT NULL, topic text NOT NULL,
    payload json, headers jsonb, created_at timestamptz NOT NULL DEFAULT now(),
    work_partition integer NOT NULL GENERATED ALWAYS AS
        ((((hashtextextended(aggregate_type || ':' || aggregate_id, 0) % 64) + 64) % 64)::integer) STORED,
    status text NOT NULL DEFAULT 'pending', attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT '-infinity', last_error text, published_at timestamptz,
    kafka_partition integer, kafka_offset bigint, failed_at timestamptz);
CREATE TABLE side (LIKE inline INCLUDING DEFAULTS INCLUDING GENERATED INCLUDING IDENTITY);
CREATE TABLE queue_events (LIKE inline INCLUDING DEFAULTS INCLUDING GENERATED INCLUDING IDENTITY)
    WITH (fillfactor = 50);
-- The outbox's indexes as migrations 1 to 12 leave them.
DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['inline', 'side'] LOOP
        EXECUTE format('ALTER TABLE %I ADD PRIMARY KEY (id)', t);
        EXECUTE format('CREATE UNIQUE INDEX ON %I (event_id)', t);
        EXECUTE format($i$CREATE INDEX ON %I (aggregate_type, aggregate_id, id) WHERE status IN ('pending', 'failed')$i$, t);
        EXECUTE format('CREATE INDEX ON %I USING brin (created_at)', t);
        EXECUTE format('CREATE INDEX ON %I USING brin (published_at)', t);
        EXECUTE format($i$CREATE INDEX ON %I (aggregate_type, aggregate_id, id)
                          WHERE status = 'failed' OR (status = 'pending' AND next_attempt_at > '-infinity')$i$, t);
        EXECUTE format($i$CREATE INDEX ON %I (id) INCLUDE (work_partition)
                          WHERE status = 'pending' AND next_attempt_at = '-infinity'$i$, t);
        EXECUTE format($i$CREATE INDEX ON %I (next_attempt_at, id) INCLUDE (work_partition)
                          WHERE status = 'pending' AND next_attempt_at > '-infinity'$i$, t);
        EXECUTE format($i$CREATE INDEX ON %I (id) WHERE status = 'failed'$i$, t);
    END LOOP;
END $$;
CREATE TABLE side_payloads (id bigint PRIMARY KEY, payload json NOT NULL, headers jsonb NOT NULL);
ALTER TABLE queue_events ADD PRIMARY KEY (id);
CREATE UNIQUE INDEX ON queue_events (event_id);
CREATE INDEX ON queue_events USING brin (created_at);
CREATE TABLE queue (id bigint PRIMARY KEY, work_partition integer NOT NULL, aggregate_type text NOT NULL,
    aggregate_id text NOT NULL, status text NOT NULL DEFAULT 'pending',
    next_attempt_at timestamptz NOT NULL DEFAULT '-infinity');
CREATE INDEX ON queue (aggregate_type, aggregate_id, id);
CREATE INDEX ON queue (id) INCLUDE (work_partition) WHERE status = 'pending' AND next_attempt_at = '-infinity';
CREATE INDEX ON queue (aggregate_type, aggregate_id, id)
    WHERE status = 'failed' OR (status = 'pending' AND next_attempt_at > '-infinity');

CREATE TABLE results (layout text, round int, load_ms float8, load_wal bigint, claim_ms float8,
                      mark_ms float8, drain_wal bigint, drained bigint, updated bigint, hot bigint);

CREATE FUNCTION reset() RETURNS void LANGUAGE sql AS
    'TRUNCATE inline, side, side_payloads, queue_events, queue RESTART IDENTITY';

CREATE PROCEDURE load(layout text, round int, n int) LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
    w0 pg_lsn := pg_current_wal_lsn();
    payload json := ('{"x":"' || repeat('p', 1000) || '"}')::json;
    headers jsonb := ('{"traceparent":"00-' || repeat('a', 150) || '"}')::jsonb;
BEGIN
    FOR i IN 1..n LOOP
        IF layout = 'inline' THEN
            INSERT INTO inline (event_id, aggregate_type, aggregate_id, event_type, schema_version, topic, payload, headers)
            VALUES (gen_random_uuid(), 'order', 'agg-' || (i % 1000), 'order.placed', 1, 'orders', payload, headers);
        ELSIF layout = 'side' THEN
            WITH r AS (INSERT INTO side (event_id, aggregate_type, aggregate_id, event_type, schema_version, topic)
                       VALUES (gen_random_uuid(), 'order', 'agg-' || (i % 1000), 'order.placed', 1, 'orders') RETURNING id)
            INSERT INTO side_payloads SELECT id, payload, headers FROM r;
        ELSE
            WITH r AS (INSERT INTO queue_events (event_id, aggregate_type, aggregate_id, event_type, schema_version, topic, payload, headers)
                       VALUES (gen_random_uuid(), 'order', 'agg-' || (i % 1000), 'order.placed', 1, 'orders', payload, headers)
                       RETURNING id, work_partition, aggregate_type, aggregate_id)
            INSERT INTO queue (id, work_partition, aggregate_type, aggregate_id) SELECT * FROM r;
        END IF;
        COMMIT;
    END LOOP;
    INSERT INTO results (layout, round, load_ms, load_wal)
    VALUES (layout, round, 1000 * extract(epoch FROM clock_timestamp() - t0), pg_wal_lsn_diff(pg_current_wal_lsn(), w0));
END $$;

CREATE PROCEDURE drain(layout text, round int, batch int) LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz;
    w0 pg_lsn := pg_current_wal_lsn();
    ids bigint[];
    bytes bigint;
    total bigint := 0;
    claim interval := '0';
    mark interval := '0';
    marked regclass := (CASE layout WHEN 'queue' THEN 'queue_events' ELSE layout END)::regclass;
    n_updated bigint := 0;
    n_hot bigint := 0;
BEGIN
    LOOP
        t0 := clock_timestamp();
        IF layout = 'inline' THEN
            SELECT array_agg(id), sum(length(p) + length(h)) INTO ids, bytes FROM (
                SELECT o.id, o.payload::text AS p, o.headers::text AS h FROM inline o
                WHERE o.status = 'pending' AND o.next_attempt_at = '-infinity'
                  AND NOT EXISTS (SELECT 1 FROM inline x WHERE x.aggregate_type = o.aggregate_type
                                  AND x.aggregate_id = o.aggregate_id AND x.id < o.id
                                  AND (x.status = 'failed' OR (x.status = 'pending' AND x.next_attempt_at > '-infinity')))
                ORDER BY o.id LIMIT batch) s;
        ELSIF layout = 'side' THEN
            SELECT array_agg(id), sum(length(p) + length(h)) INTO ids, bytes FROM (
                SELECT o.id, coalesce(p.payload, o.payload)::text AS p, coalesce(p.headers, o.headers)::text AS h
                FROM side o LEFT JOIN side_payloads p ON p.id = o.id
                WHERE o.status = 'pending' AND o.next_attempt_at = '-infinity'
                  AND NOT EXISTS (SELECT 1 FROM side x WHERE x.aggregate_type = o.aggregate_type
                                  AND x.aggregate_id = o.aggregate_id AND x.id < o.id
                                  AND (x.status = 'failed' OR (x.status = 'pending' AND x.next_attempt_at > '-infinity')))
                ORDER BY o.id LIMIT batch) s;
        ELSE
            SELECT array_agg(id), sum(length(p) + length(h)) INTO ids, bytes FROM (
                SELECT o.id, o.payload::text AS p, o.headers::text AS h FROM queue q JOIN queue_events o ON o.id = q.id
                WHERE q.status = 'pending' AND q.next_attempt_at = '-infinity'
                  AND NOT EXISTS (SELECT 1 FROM queue x WHERE x.aggregate_type = q.aggregate_type
                                  AND x.aggregate_id = q.aggregate_id AND x.id < q.id
                                  AND (x.status = 'failed' OR (x.status = 'pending' AND x.next_attempt_at > '-infinity')))
                ORDER BY q.id LIMIT batch) s;
        END IF;
        claim := claim + (clock_timestamp() - t0);
        EXIT WHEN ids IS NULL;
        t0 := clock_timestamp();
        IF layout = 'inline' THEN
            UPDATE inline o SET status = 'published', published_at = now(), attempts = o.attempts + 1,
                   kafka_partition = 0, kafka_offset = u.id
            FROM unnest(ids) AS u(id) WHERE o.id = u.id AND o.status = 'pending';
        ELSIF layout = 'side' THEN
            UPDATE side o SET status = 'published', published_at = now(), attempts = o.attempts + 1,
                   kafka_partition = 0, kafka_offset = u.id
            FROM unnest(ids) AS u(id) WHERE o.id = u.id AND o.status = 'pending';
        ELSE
            DELETE FROM queue WHERE id = ANY(ids);
            UPDATE queue_events o SET status = 'published', published_at = now(), attempts = o.attempts + 1,
                   kafka_partition = 0, kafka_offset = u.id
            FROM unnest(ids) AS u(id) WHERE o.id = u.id AND o.status = 'pending';
        END IF;
        n_updated := pg_stat_get_xact_tuples_updated(marked);
        n_hot := pg_stat_get_xact_tuples_hot_updated(marked);
        COMMIT;
        mark := mark + (clock_timestamp() - t0);
        total := total + cardinality(ids);
    END LOOP;
    UPDATE results r SET claim_ms = 1000 * extract(epoch FROM claim), mark_ms = 1000 * extract(epoch FROM mark),
                         drain_wal = pg_wal_lsn_diff(pg_current_wal_lsn(), w0), drained = total,
                         updated = n_updated, hot = n_hot
    WHERE r.layout = drain.layout AND r.round = drain.round;
END $$;

SET enable_seqscan = off;
SET enable_bitmapscan = off;
SET synchronous_commit = off;
\o /dev/null
SELECT s FROM generate_series(1, 3) AS round,
     unnest(ARRAY['inline', 'side', 'queue']) WITH ORDINALITY AS l(layout, n),
     LATERAL unnest(ARRAY[
        'SELECT mark_layouts.reset()', 'CHECKPOINT',
        format('CALL mark_layouts.load(%L, %s, 20000)', layout, round),
        'ANALYZE mark_layouts.inline', 'ANALYZE mark_layouts.side', 'ANALYZE mark_layouts.side_payloads',
        'ANALYZE mark_layouts.queue_events', 'ANALYZE mark_layouts.queue', 'CHECKPOINT',
        format('CALL mark_layouts.drain(%L, %s, 1000)', layout, round)]) WITH ORDINALITY AS st(s, k)
ORDER BY round, n, k \gexec
\o

\echo Medians of three rounds, 20,000 events (times in ms, WAL in bytes per event; drain_ms is the median of claim + mark):
SELECT layout,
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY load_ms)) AS append_ms,
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY load_wal) / 20000) AS append_wal,
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY claim_ms)) AS claim_ms,
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY mark_ms)) AS mark_ms,
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY claim_ms + mark_ms)) AS drain_ms,
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY drain_wal) / 20000) AS drain_wal,
       min(drained) AS drained, min(hot) || ' of ' || min(updated) AS hot_updates
FROM results GROUP BY layout ORDER BY min(CASE layout WHEN 'inline' THEN 1 WHEN 'side' THEN 2 ELSE 3 END);
\o /dev/null
DROP SCHEMA mark_layouts CASCADE;
