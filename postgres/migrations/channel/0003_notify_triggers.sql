-- Wake subscriptions on queued triggers: one notification on channel nudge_channel_triggers per
-- transaction that queues triggers, delivered after the commit; the payload is the schema.
-- Subscriptions LISTEN on it instead of polling every PollInterval; their poll stays as a
-- fallback.
CREATE FUNCTION nudge_notify_channel_triggers() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('nudge_channel_triggers', TG_TABLE_SCHEMA);
    RETURN NULL;
END
$$;

CREATE TRIGGER nudge_channel_triggers_notify AFTER INSERT ON nudge_channel_triggers
    FOR EACH STATEMENT EXECUTE FUNCTION nudge_notify_channel_triggers();
