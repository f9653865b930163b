package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/projection"
	pjpg "github.com/nudgeworks/nudge/projection/postgres"
)

const skipDoc = `Moves PROJECTION's position past exactly one event, without handling it, and records the
skip (who, when, why) in its status. The event must be the one the projection is failing on
(unless --force) and the next one it would handle. This goes through projection.Runner.Skip.

The projection's on-skip hook (projection.Config.SkipFunc) does NOT run: this command does
not have the application's projection definitions. If the projection has an on-skip hook
that must run, call Runner.Skip from the application instead.

With --force (the projection is not failing on the event), this command cannot know which
event types the projection reads, so the event must be the very next event in the whole
store after the projection's position; otherwise the skip is refused.
`

// skipHookNote is printed after every skip done by the CLI.
const skipHookNote = "note: the projection's on-skip hook (SkipFunc), if it has one, did not run: " +
	"the CLI does not have the projection's definition; call Runner.Skip from the application when the hook must run"

func (c *cli) skip(ctx context.Context, args []string) error {
	cmd := command{name: "skip", synopsis: "PROJECTION --event EVENT_UUID --reason TEXT [--by NAME] [--force]", doc: skipDoc}
	fs := newFlagSet(cmd.name)
	event := fs.String("event", "", "`UUID` of the event to skip (required)")
	reason := fs.String("reason", "", "why the event is skipped, recorded with the skip (required)")
	by := fs.String("by", "", "who skips (default $USER)")
	force := fs.Bool("force", false, "skip the event even though the projection is not failing on it")
	pos, err := c.parse(fs, cmd, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErrorf("skip takes one projection name, got %d arguments; run 'nudge skip -h'", len(pos))
	}
	name := pos[0]
	if err := projection.ValidateName(name); err != nil {
		return usageErrorf("skip: %v", err)
	}
	if *event == "" {
		return usageErrorf("skip needs --event EVENT_UUID: the id of the event to skip (the projection's failing event, see its status)")
	}
	eventID, err := uuid.Parse(*event)
	if err != nil {
		return usageErrorf("--event %q is not a UUID", *event)
	}
	if strings.TrimSpace(*reason) == "" {
		return usageErrorf("skip needs --reason TEXT: it is recorded with the skip")
	}

	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	backend, err := c.projectionBackend(pool)
	if err != nil {
		return err
	}

	// A stand-in definition with the projection's name. Its handler never runs (Skip does not
	// handle events); its type decides which event Skip takes as "next".
	runner, err := skipRunner(backend, name, nil)
	if err != nil {
		return err
	}
	st, err := runner.Status(ctx, name)
	if err != nil {
		if errors.Is(err, projection.ErrNotRegistered) {
			return fmt.Errorf("no projection named %s in this database (no status row in nudge_projections); check the name and --schema", name)
		}
		return fmt.Errorf("read the status of projection %s: %w", name, err)
	}
	if fe := st.FailingEvent; fe != nil && fe.ID == eventID {
		// The failing event is the first event of the projection's own types after its
		// position, so it is also the first of its type there: reading only that type finds
		// exactly the event the application's Runner.Skip would find.
		if runner, err = skipRunner(backend, name, []string{fe.Type}); err != nil {
			return err
		}
	}
	skipped, err := runner.Skip(ctx, name, eventID, projection.SkipOptions{Reason: *reason, By: c.actor(*by), Force: *force})
	if err != nil {
		if errors.Is(err, projection.ErrSkipRefused) {
			return fmt.Errorf("skip refused: %w", err)
		}
		return fmt.Errorf("skip: %w", err)
	}
	after, err := runner.Status(ctx, name)
	if err != nil {
		return fmt.Errorf("skipped, but could not read the status of projection %s: %w", name, err)
	}
	fmt.Fprintf(c.stdout, "skipped event %s (type %s, stream %s, position %s) of projection %s\n",
		skipped.ID, skipped.Type, skipped.StreamID, skipped.Position, name)
	fmt.Fprintf(c.stdout, "projection %s: state %s, position %s\n", name, after.State, after.Position)
	fmt.Fprintln(c.stderr, skipHookNote)
	return nil
}

// skipRunner returns a runner with a stand-in projection called name that reads the given
// event types (every type when types is empty) and has no hooks.
func skipRunner(backend *pjpg.Backend, name string, types []string) (*projection.Runner, error) {
	refuse := func(context.Context) error {
		return errors.New("nudge cli: this projection definition only serves skips and handles no events")
	}
	var handlers []projection.Handler
	for _, t := range types {
		handlers = append(handlers, projection.OnIdempotent(t, func(ctx context.Context, _ projection.Event[json.RawMessage]) error {
			return refuse(ctx)
		}))
	}
	if len(handlers) == 0 {
		handlers = append(handlers, projection.OnAnyIdempotent(func(ctx context.Context, _ eventstore.Event) error { return refuse(ctx) }))
	}
	p, err := projection.New(name, projection.Config{}, handlers...)
	if err != nil {
		return nil, err
	}
	return projection.NewRunner(backend, projection.RunnerConfig{Logger: slog.New(slog.DiscardHandler)}, p)
}

// projectionBackend returns the PostgreSQL projection backend in --schema.
func (c *cli) projectionBackend(pool *pgxpool.Pool) (*pjpg.Backend, error) {
	store, err := espg.New(pool, espg.Config{Schema: c.g.schema})
	if err != nil {
		return nil, usageErrorf("--schema: %v", err)
	}
	return pjpg.New(pool, store)
}
