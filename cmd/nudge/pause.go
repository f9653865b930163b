package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/name"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/trigger"
)

const pauseDoc = `Pauses the projection in every process: its batches stop (a batch in flight finishes first)
until 'nudge resume'. Events are not lost: they wait in the store, and the lag grows. Every
partition of a partitioned projection is paused. Who paused it (--by) and when are recorded in
nudge_projections (state_changed_by, state_changed_at); 'nudge status' and the console show
them. Pausing a paused projection changes nothing and says who paused it; exit status 0 either
way. The command needs no worker and no channel.
`

const resumeDoc = `Resumes a paused projection in every process (every partition of a partitioned one), records
who resumed it (--by) and when, and publishes a catch-up trigger on --channel so that its
worker reads on at once. When no worker consumes from that channel (or it cannot be reached),
the projection is resumed all the same and catches up at its next trigger or safety-net tick
(worker.Config.SafetyNet); the command says so on stderr and exits 0. Resuming a projection
that is not paused changes nothing and says so.
`

// notRegisteredError is a projection name without a status row; it matches
// projection.ErrNotRegistered.
type notRegisteredError struct{ name string }

func (e *notRegisteredError) Error() string {
	return fmt.Sprintf("no projection named %s in this database (no status row in nudge_projections); check the name ('nudge status' lists them) and --schema", e.name)
}

func (e *notRegisteredError) Is(target error) bool { return target == projection.ErrNotRegistered }

// pause runs 'nudge pause' (pause true) or 'nudge resume'.
func (c *cli) pause(ctx context.Context, args []string, pause bool) error {
	cmd := command{name: "pause", synopsis: "PROJECTION [--by NAME]", doc: pauseDoc}
	if !pause {
		cmd = command{name: "resume", synopsis: "PROJECTION [--by NAME]", doc: resumeDoc}
	}
	fs := newFlagSet(cmd.name)
	by := fs.String("by", "", "who, a `NAME` recorded with the state (default $USER)")
	pos, err := c.parse(fs, cmd, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErrorf("%s takes one PROJECTION name ('nudge status' lists them), got %d arguments", cmd.name, len(pos))
	}
	n := pos[0]
	if err := name.Validate(n); err != nil {
		return usageErrorf("%s: %v", cmd.name, err)
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
	to, from := projection.StatePaused, []projection.State(nil)
	if !pause {
		to, from = projection.StateRunning, []projection.State{projection.StatePaused}
	}
	who := c.actor(*by)
	changed, err := backend.SetStateOfBy(ctx, n, who, to, from...)
	switch {
	case errors.Is(err, projection.ErrNotRegistered):
		return &notRegisteredError{name: n}
	case err != nil:
		return fmt.Errorf("%s projection %s: %w", cmd.name, n, projectionTableError(err))
	case !changed:
		st, err := backend.StatusOf(ctx, n)
		if err != nil {
			return fmt.Errorf("read the status of projection %s: %w", n, err)
		}
		fmt.Fprintln(c.stdout, unchangedText(st, pause))
		return nil
	case pause:
		fmt.Fprintf(c.stdout, "paused projection %s (by %s): its batches stop in every process until 'nudge resume %s'\n", n, terminalSafe(who), n)
		return nil
	}
	return c.nudgeResumed(ctx, pool, n, who)
}

// unchangedText says why a pause or a resume changed nothing, naming who paused the
// projection and since when.
func unchangedText(st projection.Status, pause bool) string {
	if !pause {
		return fmt.Sprintf("projection %s is not paused (%s): nothing changed", st.Name, st.State)
	}
	return fmt.Sprintf("projection %s was already %s: nothing changed", st.Name, pausedText(st))
}

// pausedText is "paused by ann since 2026-…", as far as the status knows who and when. It
// holds text from the database, made terminal-safe.
func pausedText(st projection.Status) string {
	text := "paused"
	if st.StateChangedBy != "" {
		text += " by " + terminalSafe(st.StateChangedBy)
	}
	if !st.StateChangedAt.IsZero() {
		text += " since " + st.StateChangedAt.UTC().Format(time.RFC3339)
	}
	return text
}

// nudgeResumed publishes a catch-up trigger to the resumed projection, so it reads on at once;
// without a worker on the channel it says that the projection catches up later.
func (c *cli) nudgeResumed(ctx context.Context, pool *pgxpool.Pool, n, who string) error {
	done := fmt.Sprintf("resumed projection %s (by %s)", n, terminalSafe(who))
	pub, closePub, err := c.publisher(ctx, pool)
	if err == nil {
		defer closePub()
		err = c.send(ctx, pub, trigger.Trigger{Projection: n, Reason: trigger.ReasonAppend, At: time.Now().UTC()})
	}
	if err != nil {
		fmt.Fprintln(c.stdout, done)
		fmt.Fprintf(c.stderr, "note: no catch-up trigger sent (%s); it catches up at its next trigger or safety-net tick\n",
			terminalSafeLines(err.Error()))
		return nil
	}
	fmt.Fprintf(c.stdout, "%s; triggered it to catch up on the %s channel\n", done, c.g.channel)
	return nil
}
