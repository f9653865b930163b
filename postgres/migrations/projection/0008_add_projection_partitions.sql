-- The partitions of partitioned projections (projection.Config.Partitions): each partition is a
-- row of its own, named '<projection>.p<index>'; partition_of is the projection's unit name,
-- partition_index and partition_count say which part of the log (by stream) the row reads.
-- NULL on the rows of projections that are not partitioned.
ALTER TABLE nudge_projections
    ADD COLUMN partition_of    text,
    ADD COLUMN partition_index integer,
    ADD COLUMN partition_count integer CHECK (partition_count > 1),
    ADD CONSTRAINT nudge_projections_partition_check CHECK (
        (partition_of IS NULL AND partition_index IS NULL AND partition_count IS NULL)
        OR (partition_of IS NOT NULL AND partition_index >= 0 AND partition_index < partition_count));

CREATE INDEX nudge_projections_partition_of_idx ON nudge_projections (partition_of) WHERE partition_of IS NOT NULL;
