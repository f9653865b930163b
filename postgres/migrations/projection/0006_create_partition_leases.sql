-- Leases on the partitions of partitioned projections (package lease): which worker owns each
-- partition, until when. A worker renews its leases every few seconds; a lease not renewed
-- (its worker died) expires and another worker claims it. Leases spread the partitions over
-- the workers; exactly-once comes from each partition's batch lock and position, so two
-- workers that both believe they own a partition (a stalled one past its expiry) still never
-- apply an event twice.
CREATE TABLE nudge_partition_leases (
    grp         text        NOT NULL,
    partition   integer     NOT NULL CHECK (partition >= 0),
    owner       text,
    expires_at  timestamptz,
    acquired_at timestamptz,
    PRIMARY KEY (grp, partition)
);

-- The workers of each group, by heartbeat: the fair share of each is computed from the live
-- ones.
CREATE TABLE nudge_partition_members (
    grp        text        NOT NULL,
    owner      text        NOT NULL,
    joined_at  timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (grp, owner)
);
