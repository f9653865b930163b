-- One row per version of a projection (projection.Config.Version): which one readers see
-- (state 'active', at most one per projection), which is being built beside it ('building') and
-- which were replaced ('retired'). unit is the name of the version's status row in
-- nudge_projections (the projection's own name for version 1, '<name>.v<N>' above); tables are
-- the stable names of its read model (views of the active version's tables). Operators may read
-- it directly, e.g.
--   SELECT projection, version, state, activated_at, retired_at FROM nudge_projection_versions;
CREATE TABLE nudge_projection_versions (
    projection   text        NOT NULL,
    version      integer     NOT NULL CHECK (version > 0),
    unit         text        NOT NULL UNIQUE,
    state        text        NOT NULL CHECK (state IN ('active', 'building', 'retired')),
    tables       text[]      NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    activated_at timestamptz,
    retired_at   timestamptz,
    dropped_at   timestamptz,
    PRIMARY KEY (projection, version)
);

CREATE UNIQUE INDEX nudge_projection_versions_active_idx ON nudge_projection_versions (projection) WHERE state = 'active';

-- Every projection registered before versions existed is version 1, and active.
INSERT INTO nudge_projection_versions (projection, version, unit, state, activated_at)
SELECT name, 1, name, 'active', created_at FROM nudge_projections;
