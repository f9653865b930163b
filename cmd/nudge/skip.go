package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/deadletter"
	dlpg "github.com/nudgeworks/nudge/deadletter/postgres"
	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/name"
	"github.com/nudgeworks/nudge/projection"
	pjpg "github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/trigger"
)

const skipDoc = `Moves PROJECTION's position past exactly one event, without handling it, and records the
skip (who, when, why) in its status. The event must be the one the projection is failing on
(unless --force) and the next one it would handle. The projection's dead letters on that event
are then resolved (note "event skipped: REASON"), so no worker replays them at its next start.

By default the request travels as a trigger (through --channel, like replay) to the worker of
the projection, which skips with the projection's definition, so its on-skip hook
(projection.Config.SkipFunc) runs; the command waits up to --wait for the skip to show in the
projection's status. Durable channels keep the request until a worker takes it.

--direct skips here instead, without a worker: the on-skip hook does NOT run, because this
command does not have the application's projection definitions. With --direct and --force the
event must be the very next event in the whole store after the projection's position.
`

// skipHookNote is printed after every skip done by the CLI itself.
const skipHookNote = "note: the projection's on-skip hook (SkipFunc), if it has one, did not run: " +
	"--direct skips without the projection's definition; skip through a worker (without --direct) when the hook must run"

func (c *cli) skip(ctx context.Context, args []string) error {
	cmd := command{name: "skip", synopsis: "PROJECTION --event EVENT_UUID --reason TEXT [--by NAME] [--force] [--direct] [--wait 30s]", doc: skipDoc}
	fs := newFlagSet(cmd.name)
	event := fs.String("event", "", "`UUID` of the event to skip (required)")
	reason := fs.String("reason", "", "why the event is skipped, a `TEXT` recorded with the skip (required)")
	by := fs.String("by", "", "who skips, a `NAME` recorded with the skip (default $USER)")
	force := fs.Bool("force", false, "skip the event even though the projection is not failing on it")
	direct := fs.Bool("direct", false, "skip here, without the projection's worker (its on-skip hook does not run)")
	wait := fs.Duration("wait", 30*time.Second, "how long to wait for the worker to do the skip")
	pos, err := c.parse(fs, cmd, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErrorf("skip takes one projection name, got %d arguments; run 'nudge skip --help'", len(pos))
	}
	target := pos[0]
	if err := name.Validate(target); err != nil {
		return usageErrorf("skip: %v", err)
	}
	if err := refuseRelay("skip", target); err != nil {
		return err
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
	req := trigger.SkipRequest{EventID: eventID, Reason: *reason, By: c.actor(*by), Force: *force}
	if !*direct {
		// The request travels as a trigger, which has a size limit.
		if _, err := (trigger.Trigger{Projection: target, Reason: trigger.ReasonSkip, At: time.Now().UTC(), Skip: &req}).Encode(); err != nil {
			return usageErrorf("--reason and --by are too long for a request to the worker (a trigger holds at most %d bytes): shorten them, "+
				"or skip with --direct", trigger.MaxSize)
		}
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
	runner, err := standInRunner(backend, target, nil, 1)
	if err != nil {
		return err
	}
	st, err := runner.Status(ctx, target)
	if err != nil {
		if errors.Is(err, projection.ErrNotRegistered) {
			return fmt.Errorf("no projection named %s in this database (no status row in nudge_projections); check the name and --schema", target)
		}
		return fmt.Errorf("read the status of projection %s: %w", target, err)
	}
	if !*direct {
		if err := c.skipThroughWorker(ctx, pool, runner, st, target, req, *wait); err != nil {
			return err
		}
		return c.resolveSkipped(ctx, pool, target, req)
	}
	if fe := st.FailingEvent; fe != nil && fe.ID == eventID {
		// The failing event is the first event of the projection's own types after its
		// position, so it is also the first of its type there: reading only that type finds
		// exactly the event the application's Runner.Skip would find.
		if runner, err = standInRunner(backend, target, []string{fe.Type}, 1); err != nil {
			return err
		}
	}
	skipped, err := runner.Skip(ctx, target, eventID, projection.SkipOptions{Reason: req.Reason, By: req.By, Force: req.Force})
	if err != nil {
		if errors.Is(err, projection.ErrSkipRefused) {
			// The runner speaks of SkipOptions.Force; here it is a flag.
			return fmt.Errorf("skip refused: %s", strings.ReplaceAll(err.Error(), "pass Force ", "pass --force "))
		}
		return fmt.Errorf("skip: %w", err)
	}
	after, err := runner.Status(ctx, target)
	if err != nil {
		return fmt.Errorf("skipped, but could not read the status of projection %s: %w", target, err)
	}
	fmt.Fprintf(c.stdout, "skipped %s of projection %s\n", eventRefText(skipped.Ref()), target)
	fmt.Fprintf(c.stdout, "projection %s: state %s, position %s\n", target, after.State, after.Position)
	fmt.Fprintln(c.stderr, skipHookNote)
	return c.resolveSkipped(ctx, pool, target, req)
}

// resolveSkipped resolves the projection's open dead letters on the skipped event: a worker
// replays failed dead letters when it starts, and the event is behind the projection now.
func (c *cli) resolveSkipped(ctx context.Context, pool *pgxpool.Pool, name string, req trigger.SkipRequest) error {
	dead, err := dlpg.New(pool, dlpg.Config{Schema: c.g.schema})
	if err != nil {
		return usageErrorf("--schema: %v", err)
	}
	f := deadletter.Filter{Projection: name, Status: []deadletter.Status{deadletter.StatusFailed, deadletter.StatusReplayed},
		Limit: deadletter.ListLimitMax}
	for {
		recs, err := dead.List(ctx, f)
		if isUndefinedTable(err) {
			return nil // no dead-letter store here
		}
		if err != nil {
			return fmt.Errorf("skipped, but could not look for the event's dead letters: %w; "+
				"resolve them with 'nudge deadletter resolve ID' ('nudge deadletter list --projection %s' lists them)", err, name)
		}
		for _, r := range recs {
			if r.FailingEvent == nil || r.FailingEvent.ID != req.EventID {
				continue
			}
			if err := dead.Resolve(ctx, r.ID, req.By, "event skipped: "+req.Reason, time.Time{}); err != nil {
				return fmt.Errorf("skipped, but could not resolve dead letter %d: %w; resolve it with 'nudge deadletter resolve %d'", r.ID, err, r.ID)
			}
			fmt.Fprintf(c.stdout, "resolved dead letter %d (it failed on the skipped event), so no worker replays it\n", r.ID)
		}
		if len(recs) < f.Limit {
			return nil
		}
		f.AfterID = recs[len(recs)-1].ID
	}
}

// standInRunner returns a runner with a stand-in definition of version version of the
// projection called name, which reads the given event types (every type when types is empty)
// and has no hooks: for the commands that act on a projection's rows (skip, drop-retired),
// never to handle events.
func standInRunner(backend *pjpg.Backend, name string, types []string, version int) (*projection.Runner, error) {
	refuse := func(context.Context) error {
		return errors.New("nudge cli: this projection definition only stands in for commands and handles no events")
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
	p, err := projection.New(name, projection.Config{Version: version}, handlers...)
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
	return pjpg.New(store)
}

// skipThroughWorker sends the skip request to the projection's worker and waits until the skip
// shows in the projection's status.
func (c *cli) skipThroughWorker(ctx context.Context, pool *pgxpool.Pool, runner *projection.Runner, st projection.Status,
	name string, req trigger.SkipRequest, wait time.Duration,
) error {
	if !req.Force && (st.FailingEvent == nil || st.FailingEvent.ID != req.EventID) {
		failing := "is not failing"
		if st.FailingEvent != nil {
			failing = "is failing on event " + st.FailingEvent.ID.String()
		}
		return fmt.Errorf("skip refused: projection %s %s, not on %s; pass --force to skip another event", name, failing, req.EventID)
	}
	pub, closeFn, err := c.publisher(ctx, pool)
	if err != nil {
		return err
	}
	defer closeFn()
	if err := c.send(ctx, pub, trigger.Trigger{Projection: name, Reason: trigger.ReasonSkip, At: time.Now().UTC(), Skip: &req}); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "asked the worker of projection %s to skip event %s; waiting up to %s\n", name, req.EventID, wait)
	deadline := time.Now().Add(wait)
	interrupted := func() error {
		return fmt.Errorf("interrupted: stopped waiting, not the request: it stays with the channel until a worker of projection %s "+
			"takes it; see 'nudge status %s'", name, name)
	}
	for {
		after, err := runner.Status(ctx, name)
		if err != nil {
			if ctx.Err() != nil {
				return interrupted() // the signal ended the read
			}
			return fmt.Errorf("read the status of projection %s: %w", name, err)
		}
		if k := after.LastSkip; k != nil && k.Event.ID == req.EventID {
			fmt.Fprintf(c.stdout, "skipped %s of projection %s, by its worker (on-skip hook included)\n", eventRefText(k.Event), name)
			fmt.Fprintf(c.stdout, "projection %s: state %s, position %s\n", name, after.State, after.Position)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no worker did the skip within %s: is a worker for projection %s running on this channel? "+
				"A refused request is logged by the worker. The request stays queued on durable channels; "+
				"--direct skips without a worker (the on-skip hook does not run)", wait, name)
		}
		select {
		case <-ctx.Done():
			return interrupted()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
