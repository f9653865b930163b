-- Events, in the global read order (transaction_id, global_position).
CREATE TABLE nudge_events (
    global_position bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The writing transaction. Readers order by it and read only below the oldest transaction
    -- still running (pg_snapshot_xmin), so a late commit can never land behind a reader.
    transaction_id  xid8        NOT NULL DEFAULT pg_current_xact_id(),
    event_id        uuid        NOT NULL,
    stream_id       text        NOT NULL,
    stream_version  bigint      NOT NULL CHECK (stream_version > 0),
    event_type      text        NOT NULL,
    payload         jsonb       NOT NULL,
    metadata        jsonb,
    recorded_at     timestamptz NOT NULL DEFAULT statement_timestamp(),
    CONSTRAINT nudge_events_event_id_key UNIQUE (event_id),
    CONSTRAINT nudge_events_stream_version_key UNIQUE (stream_id, stream_version)
);

-- The read order. Without it every horizon read sorts the table.
CREATE INDEX nudge_events_read_order_idx ON nudge_events (transaction_id, global_position);

-- One row per stream: its version and the transaction that appended to it last. Appends lock the
-- row, which serialises writers of one stream, and compare transaction ids to keep the stream's
-- versions in read order.
CREATE TABLE nudge_streams (
    stream_id           text        PRIMARY KEY,
    version             bigint      NOT NULL,
    last_transaction_id xid8        NOT NULL,
    updated_at          timestamptz NOT NULL DEFAULT statement_timestamp()
);
