package nudgetest

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/projection"
)

// Row is a row of a query's result: column name → value, as pgx decodes it (int32 for an
// integer column, int64 for a bigint, string for text, time.Time for a timestamp, nil for
// NULL).
type Row = map[string]any

// Rows runs query with args on the kit's database and returns its rows; it fails t if the
// query fails.
func (k *Kit) Rows(t testing.TB, query string, args ...any) []Row {
	t.Helper()
	if k.DB == nil {
		t.Fatalf("nudgetest: Rows and RequireRows need a database, and this kit is in memory (NewInMemory): use New on nudgetest.Database")
	}
	ctx, cancel := waitContext()
	defer cancel()
	rows, err := k.DB.Pool.Query(ctx, query, args...)
	if err != nil {
		t.Fatalf("nudgetest: query %s: %v", query, err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowToMap)
	if err != nil {
		t.Fatalf("nudgetest: query %s: %v", query, err)
	}
	return got
}

// RequireRows fails t unless query (with args) returns exactly the rows want, in order (give
// the query an ORDER BY). Values compare by how they print, so a want of 2 matches an int32,
// an int64 or a numeric 2; a string (of any string type) is quoted; []byte compares as a
// string; a time compares in UTC; nil is NULL. The failure
// message lists the wanted and the returned rows one per line, each column as name=value in
// name order.
func (k *Kit) RequireRows(t testing.TB, want []Row, query string, args ...any) {
	t.Helper()
	got := k.Rows(t, query, args...)
	w, g := formatRows(want), formatRows(got)
	if slices.Equal(w, g) {
		return
	}
	t.Fatalf("nudgetest: %s\nreturned %d rows, want %d:\n%s", query, len(got), len(want), diffLines(w, g))
}

// formatRows renders each row as its columns, name=value, sorted by name.
func formatRows(rows []Row) []string {
	out := make([]string, len(rows))
	for i, row := range rows {
		cols := make([]string, 0, len(row))
		for _, name := range slices.Sorted(maps.Keys(row)) {
			cols = append(cols, name+"="+formatValue(row[name]))
		}
		out[i] = strings.Join(cols, " ")
	}
	return out
}

func formatValue(v any) string {
	switch v := v.(type) {
	case nil:
		return "NULL"
	case string:
		return fmt.Sprintf("%q", v)
	case []byte:
		return fmt.Sprintf("%q", v)
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano)
	case pgtype.Numeric:
		if b, err := v.MarshalJSON(); err == nil {
			return string(b) // 2, 2.5, NaN: as a number prints
		}
	}
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.String {
		return fmt.Sprintf("%q", rv.String()) // a named string type (a state, say) is a string
	}
	if s, ok := v.(fmt.Stringer); ok {
		return s.String()
	}
	return fmt.Sprint(v)
}

// diffLines shows want and got line by line: "  " for a line both have at that index, "- "
// for a wanted line, "+ " for a returned one.
func diffLines(want, got []string) string {
	var b strings.Builder
	for i := range max(len(want), len(got)) {
		switch {
		case i < len(want) && i < len(got) && want[i] == got[i]:
			fmt.Fprintf(&b, "    %s\n", want[i])
		default:
			if i < len(want) {
				fmt.Fprintf(&b, "  - %s\n", want[i])
			}
			if i < len(got) {
				fmt.Fprintf(&b, "  + %s\n", got[i])
			}
		}
	}
	b.WriteString("(- want, + got)")
	return b.String()
}

// Status returns the status of the projection called name; it fails t if there is none.
func (k *Kit) Status(t testing.TB, name string) projection.Status {
	t.Helper()
	ctx, cancel := waitContext()
	defer cancel()
	st, err := k.Client.Status(ctx, name)
	if err != nil {
		t.Fatalf("nudgetest: status of %s: %v", name, err)
	}
	return st
}

// RequireCondition fails t unless the projection called name is in condition want
// (projection.ConditionCaughtUp, ConditionFailing, …); the message shows its status.
func (k *Kit) RequireCondition(t testing.TB, name string, want projection.Condition) projection.Status {
	t.Helper()
	st := k.Status(t, name)
	if got := st.Condition(); got != want {
		t.Fatalf("nudgetest: projection %s is %s, want %s\n%s", name, got, want, describe(st))
	}
	return st
}

// RequireFailure fails t unless the projection called name is failing with an error that
// contains errorContains. It returns the status, whose FailingEvent names the event.
func (k *Kit) RequireFailure(t testing.TB, name, errorContains string) projection.Status {
	t.Helper()
	st := k.Status(t, name)
	if st.State != projection.StateFailing || st.FailingEvent == nil {
		t.Fatalf("nudgetest: projection %s is not failing, want a failure with %q\n%s", name, errorContains, describe(st))
	}
	if !strings.Contains(st.LastError, errorContains) {
		t.Fatalf("nudgetest: projection %s fails with an error without %q\n%s", name, errorContains, describe(st))
	}
	return st
}

// describe shows the parts of st a failing assertion needs.
func describe(st projection.Status) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  state %s, position %s, %d events processed, lag %d", st.State, st.Position, st.EventsProcessed, st.LagEvents)
	if st.HeldByHorizon {
		b.WriteString(", held by an open transaction")
	}
	if st.FailingEvent != nil {
		fmt.Fprintf(&b, "\n  failing event %s %s at position %s of stream %s, %d attempts",
			st.FailingEvent.Type, st.FailingEvent.ID, st.FailingEvent.Position, st.FailingEvent.StreamID, st.Attempts)
	}
	if st.LastError != "" {
		fmt.Fprintf(&b, "\n  last error: %s", st.LastError)
	}
	if st.ParkedStreams > 0 {
		fmt.Fprintf(&b, "\n  %d parked streams", st.ParkedStreams)
	}
	return b.String()
}

// RequireParked fails t unless the streams the projection called name has parked are exactly
// streams (in any order; none for none). It returns the parked streams.
func (k *Kit) RequireParked(t testing.TB, name string, streams ...string) []projection.ParkedStream {
	t.Helper()
	ctx, cancel := waitContext()
	defer cancel()
	parked, err := k.Client.Parked(ctx, name)
	if err != nil {
		t.Fatalf("nudgetest: parked streams of %s: %v", name, err)
	}
	got := make([]string, len(parked))
	for i, p := range parked {
		got[i] = p.StreamID
	}
	want := slices.Sorted(slices.Values(streams))
	slices.Sort(got)
	if slices.Equal(want, got) {
		return parked
	}
	lines := make([]string, len(parked))
	for i, p := range parked {
		lines[i] = fmt.Sprintf("  %s: parked at %s %s (version %d), %d later events held: %s",
			p.StreamID, p.Event.Type, p.Event.ID, p.StreamVersion, p.Held, p.Error)
	}
	t.Fatalf("nudgetest: projection %s parked %q, want %q\n%s", name, got, want, strings.Join(lines, "\n"))
	return nil
}

// RequireDeadLetters fails t unless the projection called name has n dead letters that are
// not replayed or resolved (deadletter.StatusFailed). It returns them. The kit itself runs no
// broker, so dead letters come from a client of the service that Run on the same database.
func (k *Kit) RequireDeadLetters(t testing.TB, name string, n int) []deadletter.Record {
	t.Helper()
	ctx, cancel := waitContext()
	defer cancel()
	recs, err := k.Client.DeadLetters().List(ctx, deadletter.Filter{Projection: name, Status: []deadletter.Status{deadletter.StatusFailed}, Limit: deadletter.ListLimitMax})
	if err != nil {
		t.Fatalf("nudgetest: dead letters of %s: %v", name, err)
	}
	if len(recs) == n {
		return recs
	}
	lines := make([]string, len(recs))
	for i, r := range recs {
		lines[i] = fmt.Sprintf("  #%d: %d attempts: %s", r.ID, r.Attempts, r.Error)
		if e := r.FailingEvent; e != nil {
			lines[i] += fmt.Sprintf(" (event %s %s at position %s)", e.Type, e.ID, e.Position)
		}
	}
	t.Fatalf("nudgetest: projection %s has %d failed dead letters, want %d\n%s", name, len(recs), n, strings.Join(lines, "\n"))
	return nil
}
