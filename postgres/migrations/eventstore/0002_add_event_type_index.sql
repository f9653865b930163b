-- Events of some types in read order, so a projection that handles a few types finds its next
-- events (and counts its lag) without walking the events of every other type. Building it on a
-- large table blocks appends for the build's time (about a second per million events here);
-- create it beforehand with CREATE INDEX CONCURRENTLY under this name to avoid that.
CREATE INDEX IF NOT EXISTS nudge_events_type_order_idx ON nudge_events (event_type, transaction_id, global_position);
