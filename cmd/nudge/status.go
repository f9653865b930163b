package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nudgeworks/nudge/deadletter"
	dlpg "github.com/nudgeworks/nudge/deadletter/postgres"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/lease"
	"github.com/nudgeworks/nudge/name"
	"github.com/nudgeworks/nudge/postgres"
	"github.com/nudgeworks/nudge/projection"
	pjpg "github.com/nudgeworks/nudge/projection/postgres"
)

const statusDoc = `Shows every projection registered in the database (or the ones named), one row each: its
one state (caught_up, working, held — waiting on an open transaction, failing, paused,
rebuilding, retired — a version a newer one replaced; the same word as the SQL view nudge_projection_conditions and the metric
projection_condition), committed position, the store's head, its lag in events and in time (the age of the
oldest event it has still to handle), the event it fails on, its dead letters with status
failed, and a note: that it waits on an open transaction (which holds every reader of the
store back; it never skips), who paused it and since when (nudge pause), its last error when
failing, its progress when rebuilding.

The lag counts the event types the projection handled when its worker last started (Runner.Init
records them in nudge_projections); a projection registered by an older nudge counts every
type until its worker restarts.

A partitioned projection (Config.Partitions) is one row, its partitions folded as
Runner.Status folds them: the worst state, the lowest position, the lags and dead letters
summed, the first failing partition's failing event. Its note counts its partitions and the
workers that hold their leases ("16 partitions, 3 owners, 1 unowned") and names the failing
partition. --partitions adds a line for each partition under it, indented: its unit name
(orders.p03), state, position, lag, failing event, dead letters and a note that starts with
its owner, the worker holding its lease ("owner host-4121-9f3a2c"), or "unowned" when no live
worker holds it (a worker without leases runs every partition without one). A partition's
unit name as PROJECTION shows that partition alone.

--json prints a JSON array sorted by name, one object per projection, with the fields
  name, state (the stored one: running, failing, paused, rebuilding), condition (the one
  state shown in the table), position, head, lag_events, lag_seconds, events_processed, held_by_horizon,
  oldest_open_transaction_seconds, holder (the transaction that holds the projection back, or
  null: transaction_id, transactions_since, held_events, held_events_more, hidden, pid, database,
  user, application_name, client_addr, started, age_seconds, state, wait_event, prepared_gid,
  writes_events), lag_estimated (lag_events counts 1,000 events and estimates the rest), failing_event ({id, type, stream_id, position} or null),
  last_error, attempts, first_failure_at, last_failure_at (null unless failing),
  dead_letters (null when the dead-letter table is missing), updated_at,
  rebuild_started_at (null if never rebuilt), rebuild ({done, total, percent, eta_seconds}
  while rebuilding, else null), last_skip ({event_id, type, stream_id, position, by, reason,
  forced, at} or null), state_changed_by and state_changed_at (who last paused or resumed it,
  and when: "" and null if nobody has), parked_streams (streams parked by OnFailure park; 'nudge parked
  list' lists them), oldest_parked_at (null when none is parked), version, active_version,
  version_state (active, building or retired) and retired_at (see Config.Version),
  partition_count (1 unless partitioned), owners (the workers holding the leases of a
  partitioned projection's partitions, sorted; null for other rows and without the lease table),
  failing_partition, and partitions: null unless partitioned, else one object per partition
  in index order, with the fields above and partition_of, partition (its index), owner (the
  worker holding its lease, null when none does) and lease_expires_at. --json always has the
  partitions; --partitions changes the table only.
Positions are "transaction/global" strings and times RFC 3339. Fields may be added, never
removed or renamed.

--watch prints the status again every --interval until Ctrl-C: on a terminal it redraws the
screen; otherwise it prints one table after another (with --json, one array per line).
`

const (
	// intervalDefault is status --watch's --interval default.
	intervalDefault = 2 * time.Second
	// intervalMin is the shortest --interval.
	intervalMin = 100 * time.Millisecond
	// noteErrorWidth is how many characters of the last error the status table shows.
	noteErrorWidth = 60
	// clearScreen moves the cursor home and clears a terminal.
	clearScreen = "\x1b[H\x1b[2J"
)

func (c *cli) status(ctx context.Context, args []string) error {
	cmd := command{name: "status", synopsis: "[PROJECTION...] [--partitions] [--json] [--watch] [--interval 2s]", doc: statusDoc}
	fs := newFlagSet(cmd.name)
	asJSON := fs.Bool("json", false, "print a JSON array instead of a table")
	expand := fs.Bool("partitions", false, "show each partition of a partitioned projection on a line of its own, with its owner")
	watch := fs.Bool("watch", false, "print the status again every --interval until Ctrl-C")
	interval := fs.Duration("interval", intervalDefault, "how often --watch redraws")
	names, err := c.parse(fs, cmd, args)
	if err != nil {
		return err
	}
	intervalSet := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "interval" {
			intervalSet = true
		}
	})
	if intervalSet && !*watch {
		return usageErrorf("--interval needs --watch")
	}
	if *interval < intervalMin {
		return usageErrorf("--interval %s is too short; use at least %s", *interval, intervalMin)
	}
	for _, projection := range names {
		if err := name.Validate(projection); err != nil {
			return usageErrorf("status: %v", err)
		}
	}
	names = uniq(names)

	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	backend, err := c.projectionBackend(pool)
	if err != nil {
		return err
	}
	dead, err := dlpg.New(pool, dlpg.Config{Schema: c.g.schema})
	if err != nil {
		return usageErrorf("--schema: %v", err)
	}
	src := statusSource{backend: backend, dead: dead, db: pool, schema: c.g.schema}
	noted, leasesNoted := false, false
	show := func(ctx context.Context, w io.Writer) error {
		rows, err := statusRows(ctx, src, names)
		if err != nil {
			return err
		}
		if !noted && len(rows) > 0 && rows[0].deadLetters == nil {
			noted = true
			fmt.Fprintln(c.stderr, "note: no dead-letter table (nudge_dead_letters) here, so no dead-letter counts; 'nudge migrate' creates it")
		}
		if !leasesNoted && ownersUnknown(rows) {
			leasesNoted = true
			fmt.Fprintln(c.stderr, "note: no lease table (nudge_partition_leases) here, so no partition owners; 'nudge migrate' creates it")
		}
		if *asJSON {
			return writeStatusJSON(w, rows, !*watch)
		}
		return writeStatusTable(w, rows, *expand)
	}
	if !*watch {
		return show(ctx, c.stdout)
	}
	return c.watchStatus(ctx, *interval, *asJSON, show)
}

// watchStatus runs show every interval until ctx ends, then returns nil. The first failure
// ends the command (a wrong name, say); later ones are printed and the watch goes on, so a
// database restart does not end it.
func (c *cli) watchStatus(ctx context.Context, interval time.Duration, asJSON bool, show func(context.Context, io.Writer) error) error {
	tty := !asJSON && isTerminal(c.stdout)
	var out bytes.Buffer
	for i := 0; ; i++ {
		// Rendered first and written at once, so a terminal never shows a half-drawn screen.
		out.Reset()
		err := show(ctx, &out)
		switch {
		case err != nil && ctx.Err() != nil:
			return nil
		case err != nil && i == 0:
			return err
		case err != nil:
			fmt.Fprintf(c.stderr, "nudge: %s (trying again in %s)\n", terminalSafe(err.Error()), interval)
		case tty:
			fmt.Fprintf(c.stdout, "%sEvery %s: nudge status (Ctrl-C to stop)  %s\n\n%s", clearScreen, interval,
				time.Now().Format(time.TimeOnly), out.Bytes())
		case asJSON:
			_, _ = c.stdout.Write(out.Bytes())
		default:
			if i > 0 {
				fmt.Fprintln(c.stdout)
			}
			fmt.Fprintf(c.stdout, "--- %s\n%s", time.Now().UTC().Format(time.RFC3339), out.Bytes())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}

// statusRow is one projection's status (folded, for a partitioned projection) and its count
// of failed dead letters (nil: unknown).
type statusRow struct {
	projection.Status
	deadLetters *int
	// partitions are the rows of a partitioned projection's partitions, in index order; nil
	// for other rows.
	partitions []statusRow
	// lease is a partition's lease (Owner "" when no live worker holds it); nil for other
	// rows, and when there is no lease table (the owner is unknown).
	lease *lease.Lease
	// oldestParked is the projection's (its partitions') parked stream parked first; nil
	// when none is.
	oldestParked *projection.ParkedStream
}

// statusSource is where status reads from: the projections' status rows, the dead letters and
// the partition leases (in db's schema).
type statusSource struct {
	backend *pjpg.Backend
	dead    *dlpg.Store
	db      postgres.DB
	schema  string
}

// statusRows reads the status of the named projections (all when names is empty; a partition's
// unit name shows that partition alone), their failed dead letters (unknown, nil, when there
// is no dead-letter table) and the owners of their partitions.
func statusRows(ctx context.Context, src statusSource, names []string) ([]statusRow, error) {
	all, err := src.backend.Statuses(ctx)
	if err != nil {
		return nil, projectionTableError(err)
	}
	statuses, err := pickStatuses(foldPartitioned(all), names)
	if err != nil {
		return nil, err
	}
	counts, err := failedDeadLetters(ctx, src.dead)
	switch {
	case isUndefinedTable(err):
		counts = nil // the counts are unknown
	case err != nil:
		return nil, fmt.Errorf("count the dead letters: %w", err)
	}
	rows := make([]statusRow, 0, len(statuses))
	for _, st := range statuses {
		leases, err := partitionLeases(ctx, src.db, src.schema, st)
		if err != nil {
			return nil, err
		}
		rows = append(rows, newStatusRow(st, counts, leases))
	}
	for i := range rows {
		if err := addOldestParked(ctx, src.backend, &rows[i]); err != nil {
			return nil, err
		}
	}
	return rows, nil
}

// addOldestParked sets r's oldest parked stream (and its partitions'), when it has any.
func addOldestParked(ctx context.Context, backend *pjpg.Backend, r *statusRow) error {
	if r.ParkedStreams == 0 {
		return nil
	}
	list, err := backend.ParkedStreams(ctx, pjpg.ParkedFilter{Projection: r.Name})
	if err != nil {
		return fmt.Errorf("read the parked streams of %s: %w", r.Name, err)
	}
	for i := range r.partitions {
		p := &r.partitions[i]
		if err := addOldestParked(ctx, backend, p); err != nil {
			return err
		}
		if p.oldestParked != nil {
			list = append(list, *p.oldestParked)
		}
	}
	for _, ps := range list {
		if r.oldestParked == nil || ps.ParkedAt.Before(r.oldestParked.ParkedAt) {
			r.oldestParked = &ps
		}
	}
	return nil
}

// failedDeadLetters counts the dead letters with status failed of every projection.
func failedDeadLetters(ctx context.Context, dead *dlpg.Store) (map[string]int, error) {
	counts := map[string]int{}
	f := deadletter.Filter{Status: []deadletter.Status{deadletter.StatusFailed}, Limit: deadletter.ListLimitMax}
	for {
		recs, err := dead.List(ctx, f)
		if err != nil {
			return nil, err
		}
		for _, r := range recs {
			counts[r.Projection]++
		}
		if len(recs) < f.Limit {
			return counts, nil
		}
		f.AfterID = recs[len(recs)-1].ID
	}
}

// unknownProjections is the error for names without a status row.
func unknownProjections(unknown []string, registered []projection.Status) error {
	quoted := make([]string, len(unknown))
	for i, n := range unknown {
		quoted[i] = strconv.Quote(n)
	}
	what := "no projection named " + strings.Join(quoted, ", ")
	if len(registered) == 0 {
		return fmt.Errorf("%s: no projection is registered in this database (a worker registers its projections when it starts); check --db and --schema", what)
	}
	names := make([]string, len(registered))
	for i, st := range registered {
		names[i] = st.Name
	}
	return fmt.Errorf("%s in this database; the registered projections are: %s", what, strings.Join(names, ", "))
}

// projectionTableError explains a missing status table.
func projectionTableError(err error) error {
	if isUndefinedTable(err) {
		return fmt.Errorf("%w: nudge's tables are not in this database or schema; check --db and --schema, or run 'nudge migrate'", err)
	}
	return fmt.Errorf("read the projections' status: %w", err)
}

// isUndefinedTable reports a query on a table that does not exist.
func isUndefinedTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}

// writeStatusTable prints rows as a table, a partitioned projection on one line; expand adds a
// line for each of its partitions under it, indented.
func writeStatusTable(w io.Writer, rows []statusRow, expand bool) error {
	if len(rows) == 0 {
		_, err := fmt.Fprintln(w, "No projections are registered in this database (a worker registers its projections when it starts).")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PROJECTION\tSTATE\tPOSITION\tHEAD\tLAG\tLAG TIME\tFAILING EVENT\tDEAD LETTERS\tNOTE")
	for _, r := range rows {
		writeStatusLine(tw, "", r)
		if expand {
			for _, p := range r.partitions {
				writeStatusLine(tw, "  ", p)
			}
		}
	}
	return tw.Flush()
}

// writeStatusLine prints r's line of the table, its name after indent.
func writeStatusLine(tw io.Writer, indent string, r statusRow) {
	failing := "-"
	if e := r.FailingEvent; e != nil {
		failing = fmt.Sprintf("%s %s at %s", e.ID, terminalSafe(e.Type), e.Position)
	}
	dead := "?"
	if r.deadLetters != nil {
		dead = strconv.Itoa(*r.deadLetters)
	}
	note := statusNote(r.Status, r.oldestParked)
	if owners := ownerNote(r); owners != "" && note == "-" {
		note = owners
	} else if owners != "" {
		note = owners + "; " + note
	}
	fmt.Fprintf(tw, "%s%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", indent, r.Name, r.Condition(), r.Position, r.Head, lagText(r.Status),
		humanDuration(r.LagTime), failing, dead, terminalSafe(note))
}

// lagText is the lag in events, with a ~ when it is an estimate.
func lagText(st projection.Status) string {
	if st.LagEstimated {
		return "~" + strconv.FormatInt(st.LagEvents, 10)
	}
	return strconv.FormatInt(st.LagEvents, 10)
}

// statusNote says what the numbers do not: why the projection waits, what it fails with, how
// far its rebuild is, which stream it parked first (oldest, nil if unknown). It holds text from
// the database (the last error, a stream id): print it through terminalSafe.
func statusNote(st projection.Status, oldest *projection.ParkedStream) string {
	notes := versionNotes(st)
	if st.HeldByHorizon {
		if st.Holder != nil {
			notes = append(notes, "waiting on "+st.Holder.Short()+" (nudge horizon)")
		} else {
			notes = append(notes, "waiting on an open transaction")
		}
	}
	if st.State == projection.StateRebuilding {
		done, total := st.Progress()
		note := fmt.Sprintf("rebuilding: %d/%d events (%s)", done, total, percent(done, total))
		if eta, ok := rebuildETA(st, time.Now()); ok {
			note += ", ETA " + humanDuration(eta)
		}
		notes = append(notes, note)
	}
	if st.State == projection.StatePaused && (st.StateChangedBy != "" || !st.StateChangedAt.IsZero()) {
		notes = append(notes, pausedText(st)+" (nudge resume "+st.Name+")")
	}
	if st.State == projection.StateFailing && st.LastError != "" {
		note := fmt.Sprintf("attempt %d: %s", st.Attempts, truncate(st.LastError, noteErrorWidth))
		if st.FailingPartition != "" {
			note = st.FailingPartition + " " + note
		}
		notes = append(notes, note)
	}
	if st.ParkedStreams > 0 {
		notes = append(notes, parkedNote(st, oldest))
	}
	if len(notes) == 0 {
		return "-"
	}
	return strings.Join(notes, "; ")
}

// parkedNote counts the projection's parked streams and names the oldest, as a failing
// projection's note names its event: stream, event, error and since when.
func parkedNote(st projection.Status, oldest *projection.ParkedStream) string {
	if oldest == nil {
		return fmt.Sprintf("%d parked streams, oldest since %s (nudge parked list %s)",
			st.ParkedStreams, st.OldestParkedAt.UTC().Format(time.RFC3339), st.Name)
	}
	what := "1 parked stream"
	if st.ParkedStreams > 1 {
		what = fmt.Sprintf("%d parked streams, the oldest", st.ParkedStreams)
	}
	return fmt.Sprintf("%s: %s since %s, event %s %s at %s: %s (nudge parked list %s)", what, oldest.StreamID,
		oldest.ParkedAt.UTC().Format(time.RFC3339), oldest.Event.ID, oldest.Event.Type, oldest.Event.Position,
		truncate(oldest.Error, noteErrorWidth), st.Name)
}

// versionNotes says where a versioned projection's row stands: a version built beside the
// active one, or one a newer version replaced. A projection with one version says nothing.
func versionNotes(st projection.Status) []string {
	switch st.VersionState {
	case projection.VersionBuilding:
		note := fmt.Sprintf("v%d building beside v%d (active); cuts over once level", st.Version, st.ActiveVersion)
		if st.ActiveVersion == 0 {
			note = fmt.Sprintf("v%d building; cuts over once level", st.Version)
		}
		return []string{note}
	case projection.VersionRetired:
		note := fmt.Sprintf("v%d retired", st.Version)
		if !st.RetiredAt.IsZero() {
			note += " at " + st.RetiredAt.UTC().Format(time.RFC3339)
		}
		if st.ActiveVersion > 0 {
			note += fmt.Sprintf(", replaced by v%d", st.ActiveVersion)
		}
		return []string{note}
	case projection.VersionActive:
		if st.Version > 1 {
			return []string{fmt.Sprintf("v%d active", st.Version)}
		}
	}
	return nil
}

// rebuildETA is how long a rebuilding projection (or a version building from the start) still
// needs at its average rate since it started; false while there is no rate yet.
func rebuildETA(st projection.Status, now time.Time) (time.Duration, bool) {
	rate := st.EventsPerSecond(now)
	if st.State != projection.StateRebuilding || rate <= 0 {
		return 0, false
	}
	return time.Duration(float64(st.LagEvents) / rate * float64(time.Second)), true
}

// percent is done of total, "100%" when there is nothing to do.
func percent(done, total int64) string {
	if total <= 0 {
		return "100%"
	}
	p := 100 * float64(done) / float64(total)
	if p >= 10 || p == 0 {
		return fmt.Sprintf("%.0f%%", math.Floor(p))
	}
	return fmt.Sprintf("%.1f%%", p)
}

// humanDuration prints d the short way operators read it: "340ms", "1.2s", "42s", "3m4s",
// "2h5m", "3d4h".
func humanDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < 10*time.Second:
		return strconv.FormatFloat(math.Floor(d.Seconds()*10)/10, 'f', 1, 64) + "s"
	case d < time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm%ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
	}
}

// statusJSON is a projection's status as --json prints it. Its fields are documented in
// statusDoc: add fields, never remove or rename one.
type statusJSON struct {
	Name                         string        `json:"name"`
	State                        string        `json:"state"`
	Condition                    string        `json:"condition"`
	Position                     string        `json:"position"`
	Head                         string        `json:"head"`
	LagEvents                    int64         `json:"lag_events"`
	LagSeconds                   float64       `json:"lag_seconds"`
	EventsProcessed              int64         `json:"events_processed"`
	HeldByHorizon                bool          `json:"held_by_horizon"`
	OldestOpenTransactionSeconds float64       `json:"oldest_open_transaction_seconds"`
	Holder                       *holderJSON   `json:"holder"`
	LagEstimated                 bool          `json:"lag_estimated"`
	FailingEvent                 *eventRefJSON `json:"failing_event"`
	LastError                    string        `json:"last_error"`
	Attempts                     int           `json:"attempts"`
	FirstFailureAt               *time.Time    `json:"first_failure_at"`
	LastFailureAt                *time.Time    `json:"last_failure_at"`
	DeadLetters                  *int          `json:"dead_letters"`
	UpdatedAt                    time.Time     `json:"updated_at"`
	RebuildStartedAt             *time.Time    `json:"rebuild_started_at"`
	Rebuild                      *rebuildJSON  `json:"rebuild"`
	LastSkip                     *lastSkipJSON `json:"last_skip"`
	StateChangedBy               string        `json:"state_changed_by"`
	StateChangedAt               *time.Time    `json:"state_changed_at"`
	ParkedStreams                int           `json:"parked_streams"`
	OldestParkedAt               *time.Time    `json:"oldest_parked_at"`
	Version                      int           `json:"version"`
	ActiveVersion                int           `json:"active_version"`
	VersionState                 string        `json:"version_state,omitempty"`
	RetiredAt                    *time.Time    `json:"retired_at"`
	PartitionCount               int           `json:"partition_count"`
	PartitionOf                  string        `json:"partition_of"`
	Partition                    *int          `json:"partition"`
	Owner                        *string       `json:"owner"`
	LeaseExpiresAt               *time.Time    `json:"lease_expires_at"`
	Owners                       []string      `json:"owners"`
	FailingPartition             string        `json:"failing_partition"`
	Partitions                   []statusJSON  `json:"partitions"`
}

// holderJSON is an eventstore.HorizonHolder as --json prints it.
type holderJSON struct {
	TransactionID     uint64     `json:"transaction_id"`
	TransactionsSince int64      `json:"transactions_since"`
	HeldEvents        int64      `json:"held_events"`
	HeldEventsMore    bool       `json:"held_events_more"`
	Hidden            string     `json:"hidden,omitempty"`
	PID               int        `json:"pid"`
	Database          string     `json:"database"`
	User              string     `json:"user"`
	ApplicationName   string     `json:"application_name"`
	ClientAddr        string     `json:"client_addr"`
	Started           *time.Time `json:"started"`
	AgeSeconds        float64    `json:"age_seconds"`
	State             string     `json:"state"`
	WaitEvent         string     `json:"wait_event"`
	PreparedGID       string     `json:"prepared_gid,omitempty"`
	WritesEvents      *bool      `json:"writes_events"`
}

func toHolderJSON(h *eventstore.HorizonHolder) *holderJSON {
	if h == nil {
		return nil
	}
	out := &holderJSON{TransactionID: h.TransactionID, TransactionsSince: h.TransactionsSince, HeldEvents: h.HeldEvents,
		HeldEventsMore: h.HeldEventsMore, Hidden: h.Hidden, PID: h.PID, Database: h.Database, User: h.User,
		ApplicationName: h.ApplicationName, ClientAddr: h.ClientAddr, Started: utcOrNil(h.Started), AgeSeconds: h.Age.Seconds(),
		State: h.State, WaitEvent: h.WaitEvent, PreparedGID: h.PreparedGID}
	if h.WritesEventsKnown {
		out.WritesEvents = &h.WritesEvents
	}
	return out
}

type rebuildJSON struct {
	Done    int64   `json:"done"`
	Total   int64   `json:"total"`
	Percent float64 `json:"percent"`
	// ETASeconds is the time left at the average rate so far; nil before there is a rate.
	ETASeconds *float64 `json:"eta_seconds"`
}

type lastSkipJSON struct {
	EventID  string    `json:"event_id"`
	Type     string    `json:"type"`
	StreamID string    `json:"stream_id"`
	Position string    `json:"position"`
	By       string    `json:"by"`
	Reason   string    `json:"reason"`
	Forced   bool      `json:"forced"`
	At       time.Time `json:"at"`
}

func toStatusJSON(r statusRow) statusJSON {
	st := r.Status
	out := statusJSON{
		Name: st.Name, State: string(st.State), Condition: string(st.Condition()), Position: st.Position.String(), Head: st.Head.String(),
		LagEvents: st.LagEvents, LagSeconds: st.LagTime.Seconds(), EventsProcessed: st.EventsProcessed,
		HeldByHorizon: st.HeldByHorizon, Holder: toHolderJSON(st.Holder), LagEstimated: st.LagEstimated,
		LastError: st.LastError, Attempts: st.Attempts, DeadLetters: r.deadLetters, UpdatedAt: st.UpdatedAt.UTC(),
		FirstFailureAt: utcOrNil(st.FirstFailureAt), LastFailureAt: utcOrNil(st.LastFailureAt),
		RebuildStartedAt: utcOrNil(st.RebuildStartedAt), FailingEvent: toEventRefJSON(st.FailingEvent),
		ParkedStreams: st.ParkedStreams, OldestParkedAt: utcOrNil(st.OldestParkedAt),
		StateChangedBy: st.StateChangedBy, StateChangedAt: utcOrNil(st.StateChangedAt),
		Version: st.Version, ActiveVersion: st.ActiveVersion, VersionState: string(st.VersionState), RetiredAt: utcOrNil(st.RetiredAt),
	}
	if st.Holder != nil {
		out.OldestOpenTransactionSeconds = st.Holder.Age.Seconds()
	}
	partitionsJSON(&out, r)
	if st.State == projection.StateRebuilding {
		done, total := st.Progress()
		p := 100.0
		if total > 0 {
			p = math.Round(1000*float64(done)/float64(total)) / 10
		}
		out.Rebuild = &rebuildJSON{Done: done, Total: total, Percent: p}
		if eta, ok := rebuildETA(st, time.Now()); ok {
			secs := math.Round(eta.Seconds()*10) / 10
			out.Rebuild.ETASeconds = &secs
		}
	}
	if k := st.LastSkip; k != nil {
		out.LastSkip = &lastSkipJSON{EventID: k.Event.ID.String(), Type: k.Event.Type, StreamID: k.Event.StreamID,
			Position: k.Event.Position.String(), By: k.By, Reason: k.Reason, Forced: k.Forced, At: k.At.UTC()}
	}
	return out
}

func utcOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

// writeStatusJSON prints rows as a JSON array: indented, or on one line (for --watch).
func writeStatusJSON(w io.Writer, rows []statusRow, indent bool) error {
	out := make([]statusJSON, 0, len(rows))
	for _, r := range rows {
		out = append(out, toStatusJSON(r))
	}
	if indent {
		return writeJSON(w, out)
	}
	return json.NewEncoder(w).Encode(out)
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// uniq drops repeated names, keeping the first of each.
func uniq(names []string) []string {
	var out []string
	for _, n := range names {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}
