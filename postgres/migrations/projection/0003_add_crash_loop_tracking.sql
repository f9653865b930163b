-- Crash-loop detection: a batch records that it starts (attempt_*) before it runs handlers, in a
-- transaction of its own; a batch that finishes clears it. A count that keeps growing at one
-- position means the process dies there. careful_* is the end of the range that is then handled
-- one event per batch, to find the event that kills the process.
ALTER TABLE nudge_projections
    ADD COLUMN attempt_transaction_id  xid8,
    ADD COLUMN attempt_global_position bigint,
    ADD COLUMN attempt_starts          integer NOT NULL DEFAULT 0,
    ADD COLUMN careful_transaction_id  xid8,
    ADD COLUMN careful_global_position bigint;
