-- Who paused or resumed a projection last, and when: an operator's action (nudge pause and
-- resume, the console, Runner.PauseBy and ResumeBy), recorded like the actions on parked
-- streams and dead letters. Batches, failures and resets leave them, so while a projection is
-- paused they name who paused it and since when. state_changed_by is NULL when the action
-- named nobody (Runner.Pause); both are NULL when nobody has paused the projection yet.
ALTER TABLE nudge_projections
    ADD COLUMN state_changed_by text,
    ADD COLUMN state_changed_at timestamptz;
