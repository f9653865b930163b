-- Streams a projection parked (projection.Config.OnFailure = 'park'): the first parked event
-- failed; the stream's later events are held by reference (counted here, never copied) until a
-- redrive applies them in order and deletes the row. A reset (rebuild) deletes the rows of its
-- projection. Operators may read it directly, e.g.
--   SELECT projection, stream_id, error, held_events, parked_at FROM nudge_projection_parked;
CREATE TABLE nudge_projection_parked (
    projection                text        NOT NULL,
    stream_id                 text        NOT NULL,
    -- The first parked event: the one the handler failed on.
    event_id                  uuid        NOT NULL,
    event_type                text        NOT NULL,
    transaction_id            xid8        NOT NULL,
    global_position           bigint      NOT NULL,
    stream_version            bigint      NOT NULL,
    error                     text        NOT NULL,
    attempts                  integer     NOT NULL,
    parked_at                 timestamptz NOT NULL,
    -- Later events of the stream the projection passed without handling them.
    held_events               bigint      NOT NULL DEFAULT 0,
    last_held_transaction_id  xid8,
    last_held_global_position bigint,
    PRIMARY KEY (projection, stream_id)
);

-- Redrives, skips and purges of parked streams: who, when and why, one row per stream.
CREATE TABLE nudge_projection_park_actions (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    projection      text        NOT NULL,
    stream_id       text        NOT NULL,
    action          text        NOT NULL CHECK (action IN ('redrive', 'skip', 'purge')),
    event_id        uuid        NOT NULL,
    transaction_id  xid8        NOT NULL,
    global_position bigint      NOT NULL,
    held_events     bigint      NOT NULL,
    error           text        NOT NULL,
    done_by         text        NOT NULL,
    reason          text        NOT NULL,
    done_at         timestamptz NOT NULL
);

CREATE INDEX nudge_projection_park_actions_projection_idx ON nudge_projection_park_actions (projection, id);
