package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/deadletter"
	dlpg "github.com/nudgeworks/nudge/deadletter/postgres"
	"github.com/nudgeworks/nudge/name"
	"github.com/nudgeworks/nudge/projection"
	pjpg "github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/trigger"
)

const rebuildDoc = `Rebuilds PROJECTION from the start of the event store: its worker runs the projection's
reset hook (projection.Config.ResetFunc, which empties the read model), sets its position back
to the start and catches up batch by batch. Only the worker has the projection's definition,
and so its reset hook: the request travels as a trigger on --channel (like skip), and durable
channels keep it until a worker takes it. 'nudge reset' is the same command.

The request carries its time, read from the database's clock (the clock that stamps the
projection's rebuild start): a worker rebuilds only if the projection's last rebuild started
before it, so a redelivered request does not start the rebuild over.

Then, unless --no-wait, the command follows the rebuild on stderr (events done/total, percent,
rate, ETA) until the projection is running and caught up (exit 0), fails on an event (exit 1,
with the event and the error), the worker dead-letters the request because the reset hook
failed (exit 1), or --timeout passes (exit 1). Ctrl-C stops the waiting, not the rebuild: it
goes on in the worker; follow it with 'nudge status PROJECTION --watch'.
`

const (
	// rebuildTimeoutDefault is rebuild's --timeout default.
	rebuildTimeoutDefault = time.Hour
	// rebuildPoll is how often rebuild reads the projection's status while it waits.
	rebuildPoll = 200 * time.Millisecond
	// rebuildNoWorkerHint is how long rebuild waits for a worker to take the request before it
	// says that none has.
	rebuildNoWorkerHint = 10 * time.Second
	// progressEvery is how often the progress is printed when stderr is not a terminal.
	progressEvery = 3 * time.Second
	// byMaxLen bounds --by: the request must fit in a trigger.
	byMaxLen = 200
)

func (c *cli) rebuild(ctx context.Context, cmdName string, args []string) error {
	cmd := command{name: cmdName, synopsis: "PROJECTION [--no-wait] [--by NAME] [--timeout 1h]", doc: rebuildDoc}
	fs := newFlagSet(cmd.name)
	noWait := fs.Bool("no-wait", false, "return once the request is sent, without following the rebuild")
	by := fs.String("by", "", "who asks, a `NAME` for the worker's log (default $USER)")
	timeout := fs.Duration("timeout", rebuildTimeoutDefault, "how long to follow the rebuild before giving up waiting (0: no limit)")
	pos, err := c.parse(fs, cmd, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErrorf("%s takes one projection name, got %d arguments; run 'nudge %s --help'", cmdName, len(pos), cmdName)
	}
	target := pos[0]
	if err := name.Validate(target); err != nil {
		return usageErrorf("%s: %v", cmdName, err)
	}
	if err := refuseRelay(cmdName, target); err != nil {
		return err
	}
	if *timeout < 0 {
		return usageErrorf("--timeout %s is negative; 0 waits without limit", *timeout)
	}
	if utf8.RuneCountInString(*by) > byMaxLen {
		return usageErrorf("--by is longer than %d characters", byMaxLen)
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
	before, err := backend.StatusOf(ctx, target)
	if errors.Is(err, projection.ErrNotRegistered) {
		all, lerr := backend.Statuses(ctx)
		if lerr != nil {
			return projectionTableError(lerr)
		}
		return unknownProjections([]string{target}, all)
	}
	if err != nil {
		return projectionTableError(err)
	}
	var at time.Time
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&at); err != nil {
		return fmt.Errorf("read the database's clock for the request's time: %w", err)
	}
	at = at.UTC()
	actor := c.actor(*by)
	if err := c.sendRebuild(ctx, pool, trigger.Trigger{Projection: target, Reason: trigger.ReasonRebuild, At: at,
		Rebuild: &trigger.RebuildRequest{By: actor}}); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "asked the worker of projection %s to rebuild it (request of %s by %s, on the %s channel)\n",
		target, at.Format(time.RFC3339Nano), terminalSafe(actor), c.g.channel)
	if *noWait {
		fmt.Fprintf(c.stdout, "not waiting; follow the rebuild with: nudge status %s --watch\n", target)
		return nil
	}
	if before.State == projection.StatePaused {
		fmt.Fprintf(c.stderr, "note: projection %s is paused; the rebuild resumes it\n", target)
	}
	dead, err := dlpg.New(pool, dlpg.Config{Schema: c.g.schema})
	if err != nil {
		return usageErrorf("--schema: %v", err)
	}
	w := &rebuildWait{c: c, backend: backend, dead: dead, name: target, at: at, timeout: *timeout,
		progress: newProgress(c.stderr, isTerminal(c.stderr))}
	return w.run(ctx)
}

// sendRebuild publishes the request on --channel.
func (c *cli) sendRebuild(ctx context.Context, pool *pgxpool.Pool, t trigger.Trigger) error {
	pub, closePub, err := c.publisher(ctx, pool)
	if err != nil {
		return err
	}
	defer closePub()
	return c.send(ctx, pub, t)
}

// rebuildWait follows a rebuild request until it is done.
type rebuildWait struct {
	c        *cli
	backend  *pjpg.Backend
	dead     *dlpg.Store
	name     string
	at       time.Time // the request's time, on the database's clock
	timeout  time.Duration
	progress *progress
	// deadAfter is the last dead-letter ID deadLettered has read.
	deadAfter int64
}

func (w *rebuildWait) run(ctx context.Context) error {
	start := time.Now()
	var deadline <-chan time.Time
	if w.timeout > 0 {
		timer := time.NewTimer(w.timeout)
		defer timer.Stop()
		deadline = timer.C
	}
	hinted, started := false, false
	var last projection.Status
	for {
		st, err := w.backend.StatusOf(ctx, w.name)
		if err != nil {
			if ctx.Err() != nil {
				return w.interrupted(last, started)
			}
			return fmt.Errorf("read the status of projection %s: %w", w.name, err)
		}
		last = st
		// The rebuild started at or after the request: ours, or a later one.
		started = !st.RebuildStartedAt.Before(w.at)
		switch {
		case started && st.State == projection.StateFailing:
			w.progress.end()
			return w.failed(st)
		case started && st.State == projection.StateRunning && st.LagEvents == 0:
			done, total := st.Progress()
			w.progress.finish(w.name, done, total, time.Since(start))
			fmt.Fprintf(w.c.stdout, "rebuilt projection %s: %d events in %s; it is running and caught up\n",
				w.name, st.EventsProcessed, humanDuration(time.Since(start)))
			return nil
		case started:
			done, total := st.Progress()
			w.progress.update(w.name, done, total)
		default:
			if err := w.deadLettered(ctx); err != nil {
				w.progress.end()
				return err
			}
			if !hinted && time.Since(start) >= rebuildNoWorkerHint {
				hinted = true
				fmt.Fprintf(w.c.stderr, "no worker has taken the request yet (%s): is a worker of projection %s running on the %s channel? Still waiting\n",
					humanDuration(time.Since(start)), w.name, w.c.g.channel)
			}
		}
		select {
		case <-ctx.Done():
			return w.interrupted(last, started)
		case <-deadline:
			w.progress.end()
			if !started {
				return fmt.Errorf("no worker took the request within %s: is a worker of projection %s running on the %s channel? "+
					"Durable channels keep the request until one does", w.timeout, w.name, w.c.g.channel)
			}
			done, total := last.Progress()
			return fmt.Errorf("projection %s is still rebuilding after %s (%d/%d events, state %s); the rebuild goes on in the worker: "+
				"follow it with 'nudge status %s --watch'", w.name, w.timeout, done, total, last.State, w.name)
		case <-time.After(rebuildPoll):
		}
	}
}

// interrupted ends the wait on Ctrl-C: the rebuild itself goes on.
func (w *rebuildWait) interrupted(last projection.Status, started bool) error {
	w.progress.end()
	where := "the request stays with the channel until a worker takes it"
	if started {
		done, total := last.Progress()
		where = fmt.Sprintf("the rebuild goes on in the worker (%d/%d events so far)", done, total)
	}
	return fmt.Errorf("interrupted: stopped waiting, not the rebuild; %s. Follow it with 'nudge status %s --watch'", where, w.name)
}

// failed reports a rebuild stopped by a handler failure.
func (w *rebuildWait) failed(st projection.Status) error {
	event := "an event"
	skip := ""
	if e := st.FailingEvent; e != nil {
		event = eventRefText(*e)
		skip = fmt.Sprintf(", or skip the event ('nudge skip %s --event %s --reason …')", w.name, e.ID)
	}
	done, total := st.Progress()
	return fmt.Errorf("projection %s failed on %s after %d/%d events of the rebuild: %s\n"+
		"Fix the handler and replay the projection's dead letters ('nudge deadletter replay --projection %s')%s: the rebuild carries on from there",
		w.name, event, done, total, terminalSafe(strings.TrimSpace(st.LastError)), w.name, skip)
}

// deadLettered returns an error if the worker dead-lettered this request (its reset hook
// failed), nil otherwise. Each call reads only the records added since the previous one.
func (w *rebuildWait) deadLettered(ctx context.Context) error {
	f := deadletter.Filter{Projection: w.name, Status: []deadletter.Status{deadletter.StatusFailed}, Limit: deadletter.ListLimitMax,
		AfterID: w.deadAfter}
	for {
		recs, err := w.dead.List(ctx, f)
		if err != nil {
			if isUndefinedTable(err) || ctx.Err() != nil {
				return nil // no dead-letter store: the timeout tells
			}
			return fmt.Errorf("look for the request among projection %s's dead letters: %w", w.name, err)
		}
		for _, r := range recs {
			t, err := trigger.Decode(r.Payload)
			if err == nil && t.Reason == trigger.ReasonRebuild && t.At.Equal(w.at) {
				return fmt.Errorf("the worker of projection %s could not start the rebuild and dead-lettered the request (dead letter %d): %s\n"+
					"The projection is unchanged. Fix the cause, then run 'nudge rebuild %s' again (replaying the dead letter only catches the projection up)",
					w.name, r.ID, terminalSafe(strings.TrimSpace(r.Error)), w.name)
			}
		}
		if len(recs) > 0 {
			w.deadAfter = recs[len(recs)-1].ID
		}
		if len(recs) < f.Limit {
			return nil
		}
		f.AfterID = w.deadAfter
	}
}

// progress prints a rebuild's progress: on a terminal one line redrawn with \r, otherwise a
// line every progressEvery.
type progress struct {
	w       io.Writer
	tty     bool
	printed time.Time // when a line was last printed
	width   int       // the length of the line on a terminal, to erase it
	// first is the first sample of the rebuild, for the rate.
	firstAt   time.Time
	firstDone int64
	sampled   bool
	now       func() time.Time
}

func newProgress(w io.Writer, tty bool) *progress {
	return &progress{w: w, tty: tty, now: time.Now}
}

// line is the progress text: done/total, percent, rate and ETA.
func (p *progress) line(name string, done, total int64) string {
	now := p.now()
	if !p.sampled || done < p.firstDone {
		p.firstAt, p.firstDone, p.sampled = now, done, true
	}
	rate, eta := "rate -", "ETA -"
	if elapsed := now.Sub(p.firstAt).Seconds(); elapsed >= 0.5 && done > p.firstDone {
		perSecond := float64(done-p.firstDone) / elapsed
		rate = fmt.Sprintf("%.0f events/s", perSecond)
		eta = "ETA " + humanDuration(time.Duration(float64(total-done)/perSecond*float64(time.Second)))
	}
	return fmt.Sprintf("rebuilding %s: %d/%d events (%s), %s, %s", name, done, total, percent(done, total), rate, eta)
}

// update prints the progress if it is time to.
func (p *progress) update(name string, done, total int64) {
	text := p.line(name, done, total)
	now := p.now()
	if p.tty {
		p.redraw(text)
		return
	}
	if !p.printed.IsZero() && now.Sub(p.printed) < progressEvery {
		return
	}
	p.printed = now
	fmt.Fprintln(p.w, text)
}

// finish prints the final line.
func (p *progress) finish(name string, done, total int64, took time.Duration) {
	text := fmt.Sprintf("rebuilt %s: %d/%d events (%s) in %s", name, done, total, percent(done, total), humanDuration(took))
	if p.tty {
		p.redraw(text)
		p.end()
		return
	}
	fmt.Fprintln(p.w, text)
}

// redraw replaces the terminal's line with text.
func (p *progress) redraw(text string) {
	pad := max(p.width-utf8.RuneCountInString(text), 0)
	fmt.Fprintf(p.w, "\r%s%s", text, strings.Repeat(" ", pad))
	p.width = utf8.RuneCountInString(text)
}

// end moves past a redrawn line, so what follows starts on a line of its own.
func (p *progress) end() {
	if p.tty && p.width > 0 {
		fmt.Fprintln(p.w)
		p.width = 0
	}
}
