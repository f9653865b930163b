-- Events operators skipped (Runner.Skip): who, when and why, one row per skip.
CREATE TABLE nudge_projection_skips (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    projection      text        NOT NULL,
    event_id        uuid        NOT NULL,
    event_type      text        NOT NULL,
    stream_id       text        NOT NULL,
    transaction_id  xid8        NOT NULL,
    global_position bigint      NOT NULL,
    skipped_by      text        NOT NULL,
    reason          text        NOT NULL,
    forced          boolean     NOT NULL,
    skipped_at      timestamptz NOT NULL
);

CREATE INDEX nudge_projection_skips_projection_idx ON nudge_projection_skips (projection, id);
