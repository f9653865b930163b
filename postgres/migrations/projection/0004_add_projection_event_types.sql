-- The event types each projection handles, written by Backend.Register at every Runner.Init, so
-- that tools without the projection's definition (the operator CLI's status and rebuild) can
-- compute its lag from the database alone. NULL means every type (an OnAnyIdempotent
-- projection); rows registered before this migration are NULL too until their next Init.
ALTER TABLE nudge_projections ADD COLUMN event_types text[];
