package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/nudgeworks/nudge/postgres"
)

const migrateDoc = `Creates or upgrades, in --schema (else the search_path's schema), the tables of nudge's
PostgreSQL packages:

  event store    nudge_events, nudge_streams
  projections    nudge_projections, nudge_projection_skips, nudge_projection_parked,
                 nudge_projection_park_actions, nudge_partition_leases,
                 nudge_partition_members, nudge_projection_versions,
                 the view nudge_projection_conditions
  dead letters   nudge_dead_letters

and records each step in nudge_schema_migrations. Safe to run again, and from several processes
at once. It creates no read model (each projection's init hook does, in its worker), and not the
PostgreSQL channel's tables (nudge_channel_*): the workers on that channel create them when they
declare their projections, and a deployment on RabbitMQ needs none.
`

func (c *cli) migrate(ctx context.Context, args []string) error {
	cmd := command{name: "migrate", synopsis: "", doc: migrateDoc}
	fs := newFlagSet(cmd.name)
	pos, err := c.parse(fs, cmd, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("migrate takes no arguments, got %q", strings.Join(pos, " "))
	}
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	// Not postgres.ComponentQueue: see migrateDoc.
	steps := []struct {
		what      string
		component postgres.Component
	}{
		{"event store", postgres.ComponentEvents},
		{"projections", postgres.ComponentProjections},
		{"dead letters", postgres.ComponentDeadLetters},
	}
	components := make([]postgres.Component, len(steps))
	for i, s := range steps {
		components[i] = s.component
	}
	if err := postgres.Migrate(ctx, pool, c.g.schema, components...); err != nil {
		return fmt.Errorf("migrate nudge's tables: %w", err)
	}
	for _, s := range steps {
		fmt.Fprintf(c.stdout, "migrated: %s\n", s.what)
	}
	return nil
}
