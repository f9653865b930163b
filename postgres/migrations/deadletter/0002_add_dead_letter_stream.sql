-- The stream of the event the projection failed on, so that a dead letter names its failing
-- event as nudge_projections does (failing_stream_id). NULL when the trigger itself was
-- invalid, and for records written before this migration until a delivery folds into them.
ALTER TABLE nudge_dead_letters ADD COLUMN failing_stream_id text;
