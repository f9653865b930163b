-- Wake listeners on appends: one notification on channel nudge_events per transaction that
-- appends events (PostgreSQL folds a transaction's identical notifications into one and
-- delivers it after the commit). The payload is the schema. The relay and pollers LISTEN on
-- it instead of polling often; their poll stays as a fallback.
--
-- A NOTIFY makes concurrent committing transactions take turns (PostgreSQL serialises the
-- commits of notifying transactions, WAL flush included), which costs concurrent appenders much
-- of their throughput. Store.Append therefore sets nudge.notify_deferred in its transaction and
-- notifies after the commit itself, once for many appends; the trigger notifies for every
-- other writer (AppendTx in a caller's transaction, COPY, SQL by hand).
CREATE FUNCTION nudge_notify_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('nudge.notify_deferred', true) IS DISTINCT FROM 'on' THEN
        PERFORM pg_notify('nudge_events', TG_TABLE_SCHEMA);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER nudge_events_notify AFTER INSERT ON nudge_events
    FOR EACH STATEMENT EXECUTE FUNCTION nudge_notify_events();
