package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/name"
	"github.com/nudgeworks/nudge/projection"
	pjpg "github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/trigger"
)

const parkedUsage = `Usage: nudge parked <command> [arguments and flags]

Parked streams are streams a projection with OnFailure park stopped handling after an event of
theirs kept failing; their later events are held until a redrive. They are kept in the table
nudge_projection_parked. Commands:
  list    [PROJECTION] [--json]
  show    PROJECTION STREAM [--json]
  redrive (PROJECTION [--stream S] | --all) [--by NAME] [--wait 30s]
  skip    PROJECTION --stream S --reason TEXT [--by NAME]
  purge   (PROJECTION | --all) --reason TEXT [--by NAME]

Run 'nudge parked <command> --help' for a command's flags.
`

func (c *cli) parked(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(c.stderr, parkedUsage)
		return usageErrorf("parked needs a command: list, show, redrive, skip or purge")
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(c.stdout, parkedUsage)
		return errHelp
	case "list":
		return c.parkedList(ctx, args[1:])
	case "show":
		return c.parkedShow(ctx, args[1:])
	case "redrive":
		return c.parkedRedrive(ctx, args[1:])
	case "skip":
		return c.parkedUnpark(ctx, projection.ParkActionSkip, args[1:])
	case "purge":
		return c.parkedUnpark(ctx, projection.ParkActionPurge, args[1:])
	}
	return usageErrorf("unknown parked command %q%s; use list, show, redrive, skip or purge", args[0],
		didYouMean(args[0], []string{"list", "show", "redrive", "skip", "purge"}))
}

// parkedBackend connects and returns the projection backend, with the pool to close.
func (c *cli) parkedBackend(ctx context.Context) (*pjpg.Backend, *pgxpool.Pool, error) {
	pool, err := c.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	b, err := c.projectionBackend(pool)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return b, pool, nil
}

// parkedJSON is a parked stream as --json prints it.
type parkedJSON struct {
	Projection    string        `json:"projection"`
	StreamID      string        `json:"stream_id"`
	Event         *eventRefJSON `json:"event"`
	StreamVersion int64         `json:"stream_version"`
	Error         string        `json:"error"`
	Attempts      int           `json:"attempts"`
	ParkedAt      time.Time     `json:"parked_at"`
	HeldEvents    int64         `json:"held_events"`
	LastHeld      string        `json:"last_held_position,omitempty"`
}

func toParkedJSON(ps projection.ParkedStream) parkedJSON {
	out := parkedJSON{Projection: ps.Projection, StreamID: ps.StreamID, Event: toEventRefJSON(&ps.Event), StreamVersion: ps.StreamVersion,
		Error: ps.Error, Attempts: ps.Attempts, ParkedAt: ps.ParkedAt, HeldEvents: ps.Held}
	if !ps.LastHeld.IsZero() {
		out.LastHeld = ps.LastHeld.String()
	}
	return out
}

func (c *cli) parkedList(ctx context.Context, args []string) error {
	cmd := command{name: "parked list", synopsis: "[PROJECTION] [--json]", doc: "Lists parked streams, by projection, the oldest first.\n"}
	fs := newFlagSet(cmd.name)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	pos, err := c.parse(fs, cmd, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return usageErrorf("parked list takes at most one projection name, got %q", strings.Join(pos, " "))
	}
	var f pjpg.ParkedFilter
	if len(pos) == 1 {
		if err := name.Validate(pos[0]); err != nil {
			return usageErrorf("parked list: %v", err)
		}
		f.Projection = pos[0]
	}
	b, pool, err := c.parkedBackend(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	list, err := b.ParkedStreams(ctx, f)
	if err != nil {
		return fmt.Errorf("list parked streams: %w", err)
	}
	if *asJSON {
		out := make([]parkedJSON, 0, len(list))
		for _, ps := range list {
			out = append(out, toParkedJSON(ps))
		}
		return writeJSON(c.stdout, out)
	}
	if len(list) == 0 {
		fmt.Fprintln(c.stdout, "No parked streams.")
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PROJECTION\tSTREAM\tPARKED AT\tATTEMPTS\tHELD\tEVENT ID\tEVENT TYPE\tVERSION\tPOSITION\tERROR")
	for _, ps := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%d\t%s\t%s\n", terminalSafe(ps.Projection), streamText(ps.StreamID),
			ps.ParkedAt.Format(time.RFC3339), ps.Attempts, ps.Held, ps.Event.ID, terminalSafe(ps.Event.Type), ps.StreamVersion,
			ps.Event.Position, terminalSafe(truncate(ps.Error, errorColumnWidth)))
	}
	return tw.Flush()
}

func (c *cli) parkedShow(ctx context.Context, args []string) error {
	cmd := command{name: "parked show", synopsis: "PROJECTION STREAM [--json]", doc: "Shows one parked stream.\n"}
	fs := newFlagSet(cmd.name)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := c.parse(fs, cmd, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usageErrorf("parked show takes a projection name and a stream id, got %d arguments", len(pos))
	}
	if err := name.Validate(pos[0]); err != nil {
		return usageErrorf("parked show: %v", err)
	}
	b, pool, err := c.parkedBackend(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	list, err := b.ParkedStreams(ctx, pjpg.ParkedFilter{Projection: pos[0], StreamID: pos[1]})
	if err != nil {
		return fmt.Errorf("read the parked stream: %w", err)
	}
	if len(list) == 0 {
		return fmt.Errorf("%w: projection %s has no parked stream %q; 'nudge parked list %s' lists them",
			projection.ErrNotParked, pos[0], terminalSafe(pos[1]), pos[0])
	}
	if *asJSON {
		return writeJSON(c.stdout, toParkedJSON(list[0]))
	}
	return writeParked(c.stdout, list[0])
}

// writeParked prints ps as "key: value" lines, every value made terminal-safe.
func writeParked(w io.Writer, ps projection.ParkedStream) error {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	line := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, terminalSafe(v)) }
	line("projection", ps.Projection)
	line("stream", ps.StreamID)
	line("parked at", ps.ParkedAt.Format(time.RFC3339Nano))
	line("first parked event id", ps.Event.ID.String())
	line("first parked event type", ps.Event.Type)
	line("first parked event version", strconv.FormatInt(ps.StreamVersion, 10))
	line("first parked event position", ps.Event.Position.String())
	line("attempts", strconv.Itoa(ps.Attempts))
	line("held events", strconv.FormatInt(ps.Held, 10))
	if !ps.LastHeld.IsZero() {
		line("last held position", ps.LastHeld.String())
	}
	line("error", strings.ReplaceAll(ps.Error, "\n", " "))
	return tw.Flush()
}

// parkedTargets returns the projections a redrive or purge is about: the one named, or with
// --all every projection that has parked streams.
func parkedTargets(ctx context.Context, b *pjpg.Backend, pos []string, all bool, cmd string) ([]string, error) {
	switch {
	case all && len(pos) > 0:
		return nil, usageErrorf("%s: give a projection or --all, not both", cmd)
	case all:
		list, err := b.ParkedStreams(ctx, pjpg.ParkedFilter{})
		if err != nil {
			return nil, fmt.Errorf("list parked streams: %w", err)
		}
		var names []string
		for _, ps := range list {
			if len(names) == 0 || names[len(names)-1] != ps.Projection {
				names = append(names, ps.Projection)
			}
		}
		return names, nil
	case len(pos) != 1:
		return nil, usageErrorf("%s takes one projection name (or --all), got %d arguments", cmd, len(pos))
	}
	if err := name.Validate(pos[0]); err != nil {
		return nil, usageErrorf("%s: %v", cmd, err)
	}
	return pos, nil
}

const parkedRedriveDoc = `Asks the worker of each projection (through --channel, like replay) to redrive its parked
streams: the worker applies each stream's parked events, in version order, through the current
handlers in one transaction and unparks the stream; a redrive that fails again leaves the
stream parked with the new error. The command waits up to --wait for the streams to unpark,
then says who unparked each one and when, or shows the new error at once (exit 1). Only a
worker has the projection's handlers, so a worker must run. A starting worker redrives its
projections' parked streams by itself: when nothing is parked any more, the command says who
unparked it last and when, and asks nothing.
`

func (c *cli) parkedRedrive(ctx context.Context, args []string) error {
	cmd := command{name: "parked redrive", synopsis: "(PROJECTION [--stream S] | --all) [--by NAME] [--wait 30s]", doc: parkedRedriveDoc}
	fs := newFlagSet(cmd.name)
	stream := fs.String("stream", "", "redrive only this `stream` (default: every parked stream of the projection)")
	all := fs.Bool("all", false, "redrive the parked streams of every projection")
	by := fs.String("by", "", "who redrives, a `NAME` recorded with the redrive (default $USER)")
	wait := fs.Duration("wait", 30*time.Second, "how long to wait for the streams to unpark")
	pos, err := c.parse(fs, cmd, args)
	if err != nil {
		return err
	}
	if *all && *stream != "" {
		return usageErrorf("parked redrive: --stream needs one projection, not --all")
	}
	b, pool, err := c.parkedBackend(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	names, err := parkedTargets(ctx, b, pos, *all, cmd.name)
	if err != nil {
		return err
	}
	if len(names) == 0 {
		fmt.Fprintln(c.stdout, "No parked streams.")
		return nil
	}
	// What is parked now, read before the request goes out: a redrive that fails at once
	// shows as attempts grown past these.
	before, err := parkedOf(ctx, b, names, *stream)
	if err != nil {
		return err
	}
	if len(before) == 0 {
		return c.alreadyUnparked(ctx, b, names, *stream)
	}
	pub, closeFn, err := c.publisher(ctx, pool)
	if err != nil {
		return err
	}
	defer closeFn()
	req := trigger.RedriveRequest{Stream: *stream, By: c.actor(*by)}
	for _, n := range names {
		if err := c.send(ctx, pub, trigger.Trigger{Projection: n, Reason: trigger.ReasonRedrive, At: time.Now().UTC(), Redrive: &req}); err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "asked the worker of projection %s to redrive %s\n", n, redriveWhat(*stream))
	}
	return c.awaitRedrive(ctx, b, before, *stream, *wait)
}

func redriveWhat(stream string) string {
	if stream == "" {
		return "its parked streams"
	}
	return fmt.Sprintf("stream %q", terminalSafe(stream))
}

// parkedOf returns the parked streams of the projections (only stream, when it is set).
func parkedOf(ctx context.Context, b *pjpg.Backend, names []string, stream string) ([]projection.ParkedStream, error) {
	var out []projection.ParkedStream
	for _, n := range names {
		list, err := b.ParkedStreams(ctx, pjpg.ParkedFilter{Projection: n, StreamID: stream})
		if err != nil {
			return nil, fmt.Errorf("read parked streams: %w", err)
		}
		out = append(out, list...)
	}
	return out, nil
}

// alreadyUnparked says, for a redrive that finds nothing parked, who unparked the stream (the
// projection's streams) last, how and when — a starting worker redrives by itself — and sends
// no request.
func (c *cli) alreadyUnparked(ctx context.Context, b *pjpg.Backend, names []string, stream string) error {
	for _, n := range names {
		what := "projection " + terminalSafe(n) + " has no parked streams"
		if stream != "" {
			what = fmt.Sprintf("stream %s of projection %s is not parked", streamText(stream), terminalSafe(n))
		}
		actions, err := b.ParkActions(ctx, pjpg.ParkActionFilter{Projection: n, StreamID: stream, Limit: 1})
		if err != nil || len(actions) == 0 {
			fmt.Fprintf(c.stdout, "%s; nothing to redrive\n", what)
			continue
		}
		fmt.Fprintf(c.stdout, "%s; nothing to redrive: last %s\n", what, parkActionText(actions[0]))
	}
	return nil
}

// parkActionText is a recorded action in words: "stream s redriven by ann at …".
func parkActionText(u projection.Unpark) string {
	verb := map[projection.ParkAction]string{projection.ParkActionRedrive: "redriven", projection.ParkActionSkip: "skipped",
		projection.ParkActionPurge: "purged"}[u.Action]
	return fmt.Sprintf("stream %s %s by %s at %s", streamText(u.Stream.StreamID), cmp.Or(verb, terminalSafe(string(u.Action))),
		terminalSafe(u.By), u.At.UTC().Format(time.RFC3339))
}

// awaitRedrive waits until the streams parked before the request (before) are gone, or their
// redrive failed (their attempts grew), or wait has passed; then it says who unparked them.
func (c *cli) awaitRedrive(ctx context.Context, b *pjpg.Backend, before []projection.ParkedStream, stream string, wait time.Duration) error {
	attempts := map[string]int{}
	var names []string
	for _, ps := range before {
		attempts[ps.Projection+"\x00"+ps.StreamID] = ps.Attempts
		if !slices.Contains(names, ps.Projection) {
			names = append(names, ps.Projection)
		}
	}
	deadline := time.Now().Add(wait)
	for {
		left, err := parkedOf(ctx, b, names, stream)
		if err != nil {
			return err
		}
		left = slices.DeleteFunc(left, func(ps projection.ParkedStream) bool {
			_, ok := attempts[ps.Projection+"\x00"+ps.StreamID]
			return !ok // parked since the request: not this redrive's
		})
		failed := 0
		for _, ps := range left {
			if ps.Attempts > attempts[ps.Projection+"\x00"+ps.StreamID] {
				failed++
			}
		}
		switch {
		case len(left) == 0:
			c.redriven(ctx, b, before)
			return nil
		case failed == len(left):
			for _, ps := range left {
				fmt.Fprintf(c.stdout, "redrive failed: projection %s, stream %s: %s\n", terminalSafe(ps.Projection), streamText(ps.StreamID),
					terminalSafe(truncate(ps.Error, 200)))
			}
			return errors.New("the redrive failed again; the streams stay parked (see 'nudge parked list')")
		case time.Now().After(deadline):
			return fmt.Errorf("%d parked streams left after %s: is a worker running on this channel? The request stays queued on durable channels", len(left), wait)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("interrupted: stopped waiting, not the request; see 'nudge parked list'")
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// redriven reports the streams that were parked as unparked, each with who unparked it and
// when (the worker this request reached, a starting worker, or an operator's skip).
func (c *cli) redriven(ctx context.Context, b *pjpg.Backend, streams []projection.ParkedStream) {
	for _, ps := range streams {
		actions, err := b.ParkActions(ctx, pjpg.ParkActionFilter{Projection: ps.Projection, StreamID: ps.StreamID, Limit: 1})
		if err != nil || len(actions) == 0 {
			fmt.Fprintf(c.stdout, "unparked: projection %s, stream %s\n", terminalSafe(ps.Projection), streamText(ps.StreamID))
			continue
		}
		fmt.Fprintf(c.stdout, "unparked: projection %s, %s\n", terminalSafe(ps.Projection), parkActionText(actions[0]))
	}
	fmt.Fprintln(c.stdout, "redriven: no parked streams left")
}

func (c *cli) parkedUnpark(ctx context.Context, action projection.ParkAction, args []string) error {
	cmd := command{name: "parked skip", synopsis: "PROJECTION --stream S --reason TEXT [--by NAME]",
		doc: "Unparks one stream WITHOUT applying its parked events: the read model never gets them; the stream's\n" +
			"later events are handled as they come. Recorded (who, when, why) in nudge_projection_park_actions.\n"}
	if action == projection.ParkActionPurge {
		cmd = command{name: "parked purge", synopsis: "(PROJECTION | --all) --reason TEXT [--by NAME]",
			doc: "Unparks every parked stream of the projection (or of all) WITHOUT applying their parked events,\n" +
				"each recorded (who, when, why) in nudge_projection_park_actions.\n"}
	}
	fs := newFlagSet(cmd.name)
	stream := fs.String("stream", "", "the `stream` to skip (required for skip)")
	reason := fs.String("reason", "", "why, a `TEXT` recorded with the action (required)")
	by := fs.String("by", "", "who, a `NAME` recorded with the action (default $USER)")
	all := fs.Bool("all", false, "purge: every projection's parked streams")
	pos, err := c.parse(fs, cmd, args)
	if err != nil {
		return err
	}
	switch {
	case strings.TrimSpace(*reason) == "":
		return usageErrorf("%s needs --reason TEXT: it is recorded with the action", cmd.name)
	case action == projection.ParkActionSkip && (*stream == "" || *all):
		return usageErrorf("parked skip needs one projection and --stream S; 'nudge parked purge' unparks every stream")
	case action == projection.ParkActionPurge && *stream != "":
		return usageErrorf("parked purge unparks every stream; 'nudge parked skip --stream S' unparks one")
	}
	b, pool, err := c.parkedBackend(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	names, err := parkedTargets(ctx, b, pos, *all, cmd.name)
	if err != nil {
		return err
	}
	for _, n := range names {
		done, err := b.Unpark(ctx, n, *stream, action, c.actor(*by), *reason)
		if err != nil {
			return fmt.Errorf("%s: %w", cmd.name, err)
		}
		for _, ps := range done {
			fmt.Fprintf(c.stdout, "unparked stream %s of projection %s without applying its %d parked events (%s)\n",
				streamText(ps.StreamID), terminalSafe(n), ps.Held+1, action)
		}
	}
	return nil
}

// noteParked tells, on stderr, how many streams the projection (every projection when name is
// "") has parked: they are failures too, kept apart from the dead letters. It says nothing when
// there are none or they cannot be read (an older database).
func (c *cli) noteParked(ctx context.Context, pool *pgxpool.Pool, name string) {
	b, err := c.projectionBackend(pool)
	if err != nil {
		return
	}
	list, err := b.ParkedStreams(ctx, pjpg.ParkedFilter{Projection: name})
	if err != nil || len(list) == 0 {
		return
	}
	fmt.Fprintf(c.stderr, "note: %d parked streams hold failed events apart from the dead letters; '%s' lists them\n",
		len(list), strings.TrimSpace("nudge parked list "+name))
}
