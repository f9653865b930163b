-- Wake listeners on appends: one notification on channel nudge_events per transaction that
-- appends events (PostgreSQL folds a transaction's identical notifications into one and
-- delivers it after the commit). The payload is the schema. The relay and pollers LISTEN on
-- it instead of polling often; their poll stays as a fallback.
CREATE FUNCTION nudge_notify_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('nudge_events', TG_TABLE_SCHEMA);
    RETURN NULL;
END
$$;

CREATE TRIGGER nudge_events_notify AFTER INSERT ON nudge_events
    FOR EACH STATEMENT EXECUTE FUNCTION nudge_notify_events();
