-- One row per projection: its committed position, state and the failure it is stuck on.
-- Operators may read it directly, e.g.
--   SELECT name, state, global_position, last_error FROM nudge_projections;
CREATE TABLE nudge_projections (
    name                    text        PRIMARY KEY,
    -- The committed position: the last event handled, in the store's read order.
    transaction_id          xid8        NOT NULL DEFAULT '0',
    global_position         bigint      NOT NULL DEFAULT 0,
    state                   text        NOT NULL DEFAULT 'running'
                            CHECK (state IN ('running', 'failing', 'paused', 'rebuilding')),
    events_processed        bigint      NOT NULL DEFAULT 0,
    last_error              text,
    -- The event the projection failed on (the first after the position), if failing.
    failing_transaction_id  xid8,
    failing_global_position bigint,
    failing_event_id        uuid,
    failing_event_type      text,
    failing_stream_id       text,
    attempts                integer     NOT NULL DEFAULT 0,
    first_failed_at         timestamptz,
    last_failed_at          timestamptz,
    rebuild_started_at      timestamptz,
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now()
);
