-- The registry of declared projections: Publish fans a trigger out to every row here.
CREATE TABLE nudge_channel_subscriptions (
    projection  text        PRIMARY KEY,
    declared_at timestamptz NOT NULL DEFAULT now()
);

-- One queue for the triggers of every projection. Columns after "projection" are the ones
-- watermill-sql's PostgreSQLQueueSchema reads and acks; payloads are bytes because raw
-- publishes (replays of dead letters) may carry anything.
CREATE TABLE nudge_channel_triggers (
    "offset"   bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    projection text        NOT NULL,
    uuid       text        NOT NULL,
    payload    bytea,
    metadata   json,
    acked      boolean     NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Each subscription reads its own rows in offset order.
CREATE INDEX nudge_channel_triggers_projection_offset ON nudge_channel_triggers (projection, "offset");

-- Messages that can never succeed (channel.DeadLetterTopic), until the dead-letter store takes them.
CREATE TABLE nudge_channel_dead_letters (
    "offset"   bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    uuid       text        NOT NULL,
    payload    bytea,
    metadata   json,
    acked      boolean     NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now()
);
