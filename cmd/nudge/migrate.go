package main

import (
	"context"
	"fmt"
	"strings"

	dlpg "github.com/nudgeworks/nudge/deadletter/postgres"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	pjpg "github.com/nudgeworks/nudge/projection/postgres"
)

const migrateDoc = `Creates or upgrades, in --schema (else the search_path's schema), the tables of nudge's
PostgreSQL packages:

  event store    nudge_events, nudge_streams
  projections    nudge_projections, nudge_projection_skips, the view nudge_projection_conditions
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
	store, err := espg.New(pool, espg.Config{Schema: c.g.schema})
	if err != nil {
		return usageErrorf("--schema: %v", err)
	}
	backend, err := pjpg.New(pool, store)
	if err != nil {
		return err
	}
	dl, err := dlpg.New(pool, dlpg.Config{Schema: c.g.schema})
	if err != nil {
		return usageErrorf("--schema: %v", err)
	}
	steps := []struct {
		what    string
		migrate func(context.Context) error
	}{
		{"event store", store.Migrate},
		{"projections", backend.Migrate},
		{"dead letters", dl.Migrate},
	}
	for _, s := range steps {
		if err := s.migrate(ctx); err != nil {
			return fmt.Errorf("migrate the %s tables: %w", s.what, err)
		}
		fmt.Fprintf(c.stdout, "migrated: %s\n", s.what)
	}
	return nil
}
