package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/deadletter"
	dlpg "github.com/nudgeworks/nudge/deadletter/postgres"
	"github.com/nudgeworks/nudge/name"
)

const deadletterUsage = `Usage: nudge deadletter <command> [arguments and flags]

Dead letters are triggers a projection could not handle; they are kept in the table
nudge_dead_letters. Commands:
  list    [--projection P] [--status failed|replayed|resolved] [--limit N] [--json]
  show    ID [--json]
  replay  (ID... | --projection P | --all) [--by NAME]
  resolve ID [--by NAME] [--note TEXT]
  purge   [--older-than 720h] [--include-unresolved]

Run 'nudge deadletter <command> --help' for a command's flags.
`

const (
	// errorColumnWidth is how many characters of the error the list table shows.
	errorColumnWidth = 60
	// purgeAgeDefault is purge's --older-than default: 30 days.
	purgeAgeDefault = 720 * time.Hour
)

func (c *cli) deadletter(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(c.stderr, deadletterUsage)
		return usageErrorf("deadletter needs a command: list, show, replay, resolve or purge")
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(c.stdout, deadletterUsage)
		return errHelp
	case "list":
		return c.deadletterList(ctx, args[1:])
	case "show":
		return c.deadletterShow(ctx, args[1:])
	case "replay":
		return c.deadletterReplay(ctx, args[1:])
	case "resolve":
		return c.deadletterResolve(ctx, args[1:])
	case "purge":
		return c.deadletterPurge(ctx, args[1:])
	}
	return usageErrorf("unknown deadletter command %q%s; use list, show, replay, resolve or purge", args[0],
		didYouMean(args[0], []string{"list", "show", "replay", "resolve", "purge"}))
}

// deadletterStore connects and returns the dead-letter store and its pool, which the caller closes.
func (c *cli) deadletterStore(ctx context.Context) (*dlpg.Store, *pgxpool.Pool, error) {
	pool, err := c.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	store, err := dlpg.New(pool, dlpg.Config{Schema: c.g.schema})
	if err != nil {
		pool.Close()
		return nil, nil, usageErrorf("--schema: %v", err)
	}
	return store, pool, nil
}

func (c *cli) deadletterList(ctx context.Context, args []string) error {
	cmd := command{name: "deadletter list", synopsis: "[--projection P] [--status S] [--limit N] [--json]",
		doc: "Lists dead letters by ascending ID: the oldest first.\n"}
	fs := newFlagSet(cmd.name)
	projection := fs.String("projection", "", "only this `projection`'s dead letters")
	status := fs.String("status", "", "only dead letters in this `status`: failed, replayed or resolved")
	limit := fs.Int("limit", deadletter.ListLimitDefault, "at most `N` dead letters (1 to "+strconv.Itoa(deadletter.ListLimitMax)+")")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	pos, err := c.parse(fs, cmd, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("deadletter list takes no arguments, got %q", strings.Join(pos, " "))
	}
	f := deadletter.Filter{Projection: *projection, Limit: *limit}
	if *projection != "" {
		if err := name.Validate(*projection); err != nil {
			return usageErrorf("--projection: %v", err)
		}
	}
	if *status != "" {
		st, err := deadletter.ParseStatus(*status)
		if err != nil {
			return usageErrorf("--status %q is not a status; use failed, replayed or resolved", *status)
		}
		f.Status = []deadletter.Status{st}
	}
	if *limit < 1 || *limit > deadletter.ListLimitMax {
		return usageErrorf("--limit %d is out of range; use 1 to %d", *limit, deadletter.ListLimitMax)
	}
	store, pool, err := c.deadletterStore(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	recs, err := store.List(ctx, f)
	if err != nil {
		return fmt.Errorf("list dead letters: %w", err)
	}
	if len(recs) == *limit {
		fmt.Fprintf(c.stderr, "(showing the first %d; raise --limit or narrow with --projection/--status for more)\n", *limit)
	}
	c.noteParked(ctx, pool, *projection)
	if *asJSON {
		out := make([]recordJSON, 0, len(recs))
		for _, r := range recs {
			out = append(out, toJSON(r))
		}
		return writeJSON(c.stdout, out)
	}
	if len(recs) == 0 {
		fmt.Fprintln(c.stdout, "No dead letters match.")
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPROJECTION\tSTATUS\tCOUNT\tATTEMPTS\tEVENT TYPE\tEVENT ID\tSTREAM\tPOSITION\tLAST FAILURE\tERROR")
	for _, r := range recs {
		evType, evID, evStream, evPos := "-", "-", "-", "-"
		if e := r.FailingEvent; e != nil {
			evType, evID, evStream, evPos = terminalSafe(e.Type), e.ID.String(), streamText(e.StreamID), e.Position.String()
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, terminalSafe(r.Projection), statusText(r), r.Count, r.Attempts,
			evType, evID, evStream, evPos, r.LastFailedAt.Format(time.RFC3339), terminalSafe(truncate(r.Error, errorColumnWidth)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return nil
}

func (c *cli) deadletterShow(ctx context.Context, args []string) error {
	cmd := command{name: "deadletter show", synopsis: "ID [--json]", doc: "Shows one dead letter with its payload and history.\n"}
	fs := newFlagSet(cmd.name)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := c.parse(fs, cmd, args)
	if err != nil {
		return err
	}
	id, err := parseOneID(pos, "deadletter show")
	if err != nil {
		return err
	}
	store, pool, err := c.deadletterStore(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	r, err := store.Get(ctx, id)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(c.stdout, toJSON(r))
	}
	return writeRecord(c.stdout, r)
}

func (c *cli) deadletterReplay(ctx context.Context, args []string) error {
	cmd := command{name: "deadletter replay", synopsis: "(ID... | --projection P | --all) [--by NAME]",
		doc: "Marks the selected failed or replayed dead letters replayed and publishes one trigger\n" +
			"to each of their projections (on --channel), which then catch up from their own\n" +
			"position. Resolved records are left alone. Give IDs, --projection or --all.\n"}
	fs := newFlagSet(cmd.name)
	projection := fs.String("projection", "", "replay every failed or replayed dead letter of this `projection`")
	all := fs.Bool("all", false, "replay every failed or replayed dead letter")
	by := fs.String("by", "", "who replays, a `NAME` kept on the records (default $USER)")
	pos, err := c.parse(fs, cmd, args)
	if err != nil {
		return err
	}
	ids, err := parseIDs(pos, "deadletter replay")
	if err != nil {
		return err
	}
	f := deadletter.ReplayFilter{IDs: ids, Projection: *projection, All: *all}
	set := 0
	for _, ok := range []bool{len(ids) > 0, *projection != "", *all} {
		if ok {
			set++
		}
	}
	if set != 1 {
		return usageErrorf("deadletter replay needs exactly one of: record IDs, --projection P, --all")
	}
	if *projection != "" {
		if err := name.Validate(*projection); err != nil {
			return usageErrorf("--projection: %v", err)
		}
	}
	store, pool, err := c.deadletterStore(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	pub, closePub, err := c.publisher(ctx, pool)
	if err != nil {
		return err
	}
	defer closePub()
	// Every projection to trigger must have a worker's subscription, or its records would be
	// marked replayed for a trigger nobody reads: check them all before changing any.
	targets, err := deadletter.ReplayTargets(ctx, store, f)
	if err != nil {
		if errors.Is(err, deadletter.ErrNotFound) {
			return fmt.Errorf("%w; nothing was replayed", err)
		}
		return fmt.Errorf("replay: %w", err)
	}
	for _, projection := range targets {
		if err := c.requireConsumer(ctx, pub, projection); err != nil {
			return fmt.Errorf("%w\nNothing was replayed", err)
		}
	}
	res, err := deadletter.Replay(ctx, store, pub, f, c.actor(*by), time.Time{})
	fmt.Fprintf(c.stdout, "replayed %d dead letter(s)", res.Replayed)
	if res.Skipped > 0 {
		fmt.Fprintf(c.stdout, ", left %d resolved one(s) alone", res.Skipped)
	}
	if len(res.Projections) > 0 {
		fmt.Fprintf(c.stdout, "; triggered %s on the %s channel", strings.Join(res.Projections, ", "), c.g.channel)
	}
	fmt.Fprintln(c.stdout)
	if err != nil {
		if errors.Is(err, deadletter.ErrNotFound) {
			return err
		}
		return fmt.Errorf("replay: %w", err)
	}
	return nil
}

func (c *cli) deadletterResolve(ctx context.Context, args []string) error {
	cmd := command{name: "deadletter resolve", synopsis: "ID [--by NAME] [--note TEXT]",
		doc: "Closes a dead letter: it is no longer replayed, and a new failure on the same event\nstarts a new record.\n"}
	fs := newFlagSet(cmd.name)
	by := fs.String("by", "", "who resolves, a `NAME` kept on the record (default $USER)")
	note := fs.String("note", "", "a `TEXT` kept with the resolution")
	pos, err := c.parse(fs, cmd, args)
	if err != nil {
		return err
	}
	id, err := parseOneID(pos, "deadletter resolve")
	if err != nil {
		return err
	}
	store, pool, err := c.deadletterStore(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	r, err := store.Get(ctx, id)
	if err != nil {
		return err
	}
	if r.Status == deadletter.StatusResolved {
		fmt.Fprintf(c.stdout, "dead letter %d was already resolved by %s at %s; nothing changed\n",
			r.ID, terminalSafe(r.ResolvedBy), r.ResolvedAt.Format(time.RFC3339))
		return nil
	}
	if err := store.Resolve(ctx, r.ID, c.actor(*by), *note, time.Time{}); err != nil {
		return fmt.Errorf("resolve: %w", err)
	}
	fmt.Fprintf(c.stdout, "resolved dead letter %d (projection %s)\n", r.ID, r.Projection)
	return nil
}

func (c *cli) deadletterPurge(ctx context.Context, args []string) error {
	cmd := command{name: "deadletter purge", synopsis: "[--older-than 720h] [--include-unresolved]",
		doc: "Deletes resolved dead letters whose last failure is older than --older-than.\n"}
	fs := newFlagSet(cmd.name)
	olderThan := fs.Duration("older-than", purgeAgeDefault, "delete records whose last failure is older than this `duration` (0: all)")
	unresolved := fs.Bool("include-unresolved", false, "also delete failed and replayed records")
	pos, err := c.parse(fs, cmd, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("deadletter purge takes no arguments, got %q", strings.Join(pos, " "))
	}
	if *olderThan < 0 {
		return usageErrorf("--older-than %s is negative", *olderThan)
	}
	store, pool, err := c.deadletterStore(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	n, err := store.Purge(ctx, deadletter.PurgeOptions{OlderThan: *olderThan, IncludeUnresolved: *unresolved})
	if err != nil {
		return fmt.Errorf("purge: %w", err)
	}
	which := "resolved"
	if *unresolved {
		which = "any-status"
	}
	fmt.Fprintf(c.stdout, "purged %d %s dead letter(s) whose last failure is older than %s\n", n, which, *olderThan)
	return nil
}

// actor is --by, or the user running the command.
func (c *cli) actor(by string) string {
	if strings.TrimSpace(by) != "" {
		return by
	}
	if u := c.env("USER"); u != "" {
		return u + " (nudge cli)"
	}
	return "nudge cli"
}

func parseIDs(args []string, cmd string) ([]int64, error) {
	ids := make([]int64, 0, len(args))
	for _, a := range args {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id <= 0 {
			return nil, usageErrorf("%s: %q is not a dead-letter ID (a positive number, as 'nudge deadletter list' shows)", cmd, a)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// truncate shortens s to n runes on one line.
func truncate(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// recordJSON is a dead letter as --json prints it.
type recordJSON struct {
	ID            int64             `json:"id"`
	Projection    string            `json:"projection"`
	Status        string            `json:"status"`
	Count         int               `json:"count"`
	Attempts      int               `json:"attempts"`
	FailingEvent  *eventRefJSON     `json:"failing_event"`
	Error         string            `json:"error"`
	MessageUUID   string            `json:"message_uuid"`
	Payload       string            `json:"payload,omitempty"`
	PayloadBase64 []byte            `json:"payload_base64,omitempty"`
	Metadata      map[string]string `json:"metadata,omitempty"`
	FirstFailedAt time.Time         `json:"first_failed_at"`
	LastFailedAt  time.Time         `json:"last_failed_at"`
	Replays       int               `json:"replays"`
	ReplayedBy    string            `json:"replayed_by,omitempty"`
	ReplayedAt    *time.Time        `json:"replayed_at,omitempty"`
	ResolvedBy    string            `json:"resolved_by,omitempty"`
	Healed        bool              `json:"healed,omitempty"`
	ResolvedAt    *time.Time        `json:"resolved_at,omitempty"`
	ResolveNote   string            `json:"resolve_note,omitempty"`
	UpdatedAt     time.Time         `json:"updated_at"`
}

func toJSON(r deadletter.Record) recordJSON {
	out := recordJSON{
		ID: r.ID, Projection: r.Projection, Status: string(r.Status), Count: r.Count, Attempts: r.Attempts,
		Error: r.Error, MessageUUID: r.MessageUUID, Metadata: r.Metadata,
		FirstFailedAt: r.FirstFailedAt, LastFailedAt: r.LastFailedAt, Replays: r.Replays,
		ReplayedBy: r.ReplayedBy, ResolvedBy: r.ResolvedBy, Healed: r.Healed(), ResolveNote: r.ResolveNote, UpdatedAt: r.UpdatedAt,
		FailingEvent: toEventRefJSON(r.FailingEvent),
	}
	if utf8.Valid(r.Payload) {
		out.Payload = string(r.Payload)
	} else {
		out.PayloadBase64 = r.Payload
	}
	if !r.ReplayedAt.IsZero() {
		out.ReplayedAt = &r.ReplayedAt
	}
	if !r.ResolvedAt.IsZero() {
		out.ResolvedAt = &r.ResolvedAt
	}
	return out
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeRecord prints r as "key: value" lines, every key and value made terminal-safe (the
// error, payload, metadata, "by" and notes come from events and users).
func writeRecord(w io.Writer, r deadletter.Record) error {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	line := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", terminalSafe(k), terminalSafe(v)) }
	when := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.Format(time.RFC3339Nano)
	}
	line("id", strconv.FormatInt(r.ID, 10))
	line("projection", r.Projection)
	line("status", statusText(r))
	line("count", strconv.Itoa(r.Count))
	line("attempts", strconv.Itoa(r.Attempts))
	if e := r.FailingEvent; e != nil {
		line("failing event type", e.Type)
		line("failing event id", e.ID.String())
		line("failing event stream", streamText(e.StreamID))
		line("failing event position", e.Position.String())
	} else {
		line("failing event", "- (the trigger itself was invalid)")
	}
	line("first failed at", when(r.FirstFailedAt))
	line("last failed at", when(r.LastFailedAt))
	line("message uuid", r.MessageUUID)
	line("error", strings.ReplaceAll(r.Error, "\n", " "))
	switch {
	case len(r.Payload) == 0:
		line("payload", "-")
	case utf8.Valid(r.Payload):
		line("payload", string(r.Payload))
	default:
		line("payload", fmt.Sprintf("%d bytes, not UTF-8 (see --json)", len(r.Payload)))
	}
	for _, k := range slices.Sorted(maps.Keys(r.Metadata)) {
		line("metadata "+k, r.Metadata[k])
	}
	line("replays", strconv.Itoa(r.Replays))
	if r.Replays > 0 {
		line("replayed by", r.ReplayedBy)
		line("replayed at", when(r.ReplayedAt))
	}
	if r.Status == deadletter.StatusResolved {
		line("resolved by", r.ResolvedBy)
		line("resolved at", when(r.ResolvedAt))
		line("resolve note", r.ResolveNote)
	}
	line("updated at", when(r.UpdatedAt))
	return tw.Flush()
}

// statusText is a record's status as list shows it: "resolved (healed)" for a record the worker
// resolved because its projection passed the failing event by itself.
func statusText(r deadletter.Record) string {
	if r.Healed() {
		return string(r.Status) + " (healed)"
	}
	return string(r.Status)
}

// parseOneID parses the single ID a command takes.
func parseOneID(args []string, cmd string) (int64, error) {
	ids, err := parseIDs(args, cmd)
	if err != nil {
		return 0, err
	}
	if len(ids) != 1 {
		return 0, usageErrorf("%s takes one ID, got %d", cmd, len(ids))
	}
	return ids[0], nil
}
