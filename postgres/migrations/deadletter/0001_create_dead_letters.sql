-- One row per dead letter: a trigger a projection gave up on, with the deliveries folded into it
-- and what operators did about it. Operators may query it directly, e.g.
--   SELECT id, projection, status, count, attempts, last_failed_at, failing_event_type, error
--   FROM nudge_dead_letters WHERE status = 'failed' ORDER BY id;
CREATE TABLE nudge_dead_letters (
    id                      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    projection              text        NOT NULL,
    -- The latest folded delivery: its broker message UUID, payload (any bytes: an invalid
    -- trigger is kept as received; read it with convert_from(payload, 'UTF8')) and metadata.
    message_uuid            text        NOT NULL,
    payload                 bytea       NOT NULL,
    metadata                jsonb       NOT NULL DEFAULT '{}',
    error                   text        NOT NULL,
    -- The event the projection failed on, in the event store's read order; NULL when the
    -- trigger itself was invalid.
    failing_transaction_id  xid8,
    failing_global_position bigint,
    failing_event_id        uuid,
    failing_event_type      text,
    -- What deliveries fold by within a projection: the failing event, or for an invalid trigger
    -- its message.
    fold_key                text        NOT NULL GENERATED ALWAYS AS (
                                CASE WHEN failing_event_id IS NOT NULL THEN failing_event_id::text
                                     ELSE 'message:' || message_uuid END) STORED,
    attempts                integer     NOT NULL CHECK (attempts > 0),
    count                   integer     NOT NULL DEFAULT 1 CHECK (count > 0),
    first_failed_at         timestamptz NOT NULL,
    last_failed_at          timestamptz NOT NULL,
    status                  text        NOT NULL DEFAULT 'failed'
                            CHECK (status IN ('failed', 'replayed', 'resolved')),
    replayed_by             text,
    replayed_at             timestamptz,
    replays                 integer     NOT NULL DEFAULT 0,
    resolved_by             text,
    resolved_at             timestamptz,
    resolve_note            text,
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now()
);

-- Folding: at most one unresolved record per projection and fold key. Adding a dead letter is
-- INSERT … ON CONFLICT on this index; a resolved record leaves it, so the next failure of the
-- same event starts a new record.
CREATE UNIQUE INDEX nudge_dead_letters_fold_idx ON nudge_dead_letters (projection, fold_key)
    WHERE status <> 'resolved';

-- Listing and replaying one projection's records, by id.
CREATE INDEX nudge_dead_letters_projection_idx ON nudge_dead_letters (projection, id);
