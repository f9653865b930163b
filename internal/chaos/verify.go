package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/chaos/chaosmodel"
)

// sighting is what a read model holds about one event: how often it was applied and when
// first.
type sighting struct {
	Count int
	First time.Time
	// Content is what the model stored about the event; Order ranks its first application
	// among the model's (a sequence, or the time in the file model).
	Content content
	Order   int64
}

// content is what every model stores about an event and the store says it is: its stream,
// stream version and payload fields.
type content struct {
	Stream  string
	Version int64
	Writer  int
	Seq     int
}

// checkContent compares every event a model holds with the store's content (stored) and checks
// that per stream the model applied versions in increasing order. It returns how many events
// hold other content, and how many were first applied before a lower version of their stream.
func checkContent(stored map[uuid.UUID]content, seen map[uuid.UUID]sighting) (mismatched, outOfOrder int) {
	type applied struct {
		version int64
		order   int64
	}
	streams := map[string][]applied{}
	for id, s := range seen {
		want, ok := stored[id]
		if !ok || s.Count == 0 {
			continue // unknown or missing: counted by compare
		}
		if s.Content != want {
			mismatched++
		}
		streams[want.Stream] = append(streams[want.Stream], applied{want.Version, s.Order})
	}
	for _, list := range streams {
		slices.SortFunc(list, func(a, b applied) int { return cmp.Compare(a.version, b.version) })
		for i := 1; i < len(list); i++ {
			if list[i].order < list[i-1].order {
				outOfOrder++
			}
		}
	}
	return mismatched, outOfOrder
}

// modelResult compares one read model with the events appended.
type modelResult struct {
	Name string `json:"name"`
	// ExactlyOnce models fail on any duplicate; the others only report them.
	ExactlyOnce bool `json:"exactly_once"`
	// Projected counts appended events the model holds.
	Projected int `json:"projected"`
	// Missing counts appended events the model does not hold.
	Missing int `json:"missing"`
	// Duplicated counts applications beyond the first, over all events.
	Duplicated int `json:"duplicated"`
	// Unknown counts events the model holds that were never appended.
	Unknown int `json:"unknown"`
	// Mismatched counts events whose stored stream, version or payload fields differ from the
	// event store's.
	Mismatched int `json:"mismatched"`
	// OutOfOrder counts events first applied before a lower version of their stream.
	OutOfOrder int `json:"out_of_order"`
	// Torn counts unreadable records (a line cut short by a kill in the file sink).
	Torn int `json:"torn,omitempty"`
	// MaxLag is the longest time from an event's append to its first application.
	MaxLag time.Duration `json:"max_lag_ns"`
	// MissingSample names a few missing events.
	MissingSample []uuid.UUID `json:"missing_sample,omitempty"`
}

// ok reports whether the model passes: nothing missing or unknown, and no duplicate in an
// exactly-once model.
func (m modelResult) ok() bool {
	return m.Missing == 0 && m.Unknown == 0 && m.Mismatched == 0 && m.OutOfOrder == 0 && (!m.ExactlyOnce || m.Duplicated == 0)
}

// compare checks what a model holds (seen) against the events appended (id → recorded time).
func compare(name string, exactlyOnce bool, appended map[uuid.UUID]time.Time, seen map[uuid.UUID]sighting) modelResult {
	r := modelResult{Name: name, ExactlyOnce: exactlyOnce}
	for id, recorded := range appended {
		s, ok := seen[id]
		if !ok || s.Count == 0 {
			r.Missing++
			if len(r.MissingSample) < 5 {
				r.MissingSample = append(r.MissingSample, id)
			}
			continue
		}
		r.Projected++
		r.Duplicated += s.Count - 1
		if lag := s.First.Sub(recorded); lag > r.MaxLag {
			r.MaxLag = lag
		}
	}
	for id, s := range seen {
		if _, ok := appended[id]; !ok && s.Count > 0 {
			r.Unknown++
		}
	}
	slices.SortFunc(r.MissingSample, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	return r
}

// maxLagBetween is the longest append-to-application time of the events appended in [from, to].
func maxLagBetween(appended map[uuid.UUID]time.Time, seen map[uuid.UUID]sighting, from, to time.Time) time.Duration {
	var worst time.Duration
	for id, recorded := range appended {
		if recorded.Before(from) || recorded.After(to) {
			continue
		}
		s, ok := seen[id]
		if !ok {
			continue // counted as missing elsewhere
		}
		worst = max(worst, s.First.Sub(recorded))
	}
	return worst
}

// recoveryTime is how long after end every read model had applied every event appended
// before end and the first event appended after it (which shows the whole path — append,
// trigger, projection — works again; with no append after end, the first part alone). Read
// models apply events in the store's order, so these events' first application times bound
// the catch-up. ok is false when one of these events is missing from a model.
func recoveryTime(appended map[uuid.UUID]time.Time, models []map[uuid.UUID]sighting, end time.Time) (d time.Duration, ok bool) {
	var (
		needed []uuid.UUID
		next   uuid.UUID
		nextAt time.Time
	)
	for id, recorded := range appended {
		if recorded.Before(end) {
			needed = append(needed, id)
		} else if nextAt.IsZero() || recorded.Before(nextAt) {
			next, nextAt = id, recorded
		}
	}
	if !nextAt.IsZero() {
		needed = append(needed, next)
	}
	var last time.Time
	for _, seen := range models {
		for _, id := range needed {
			s, found := seen[id]
			if !found {
				return 0, false
			}
			if s.First.After(last) {
				last = s.First
			}
		}
	}
	return max(0, last.Sub(end)), true
}

// readAppended reads every event of the suite's type from the store: id → recorded time, and
// id → content.
func readAppended(ctx context.Context, store eventstore.Store) (map[uuid.UUID]time.Time, map[uuid.UUID]content, error) {
	out, contents := map[uuid.UUID]time.Time{}, map[uuid.UUID]content{}
	var after eventstore.Position
	for {
		events, err := store.Read(ctx, after, eventstore.ReadOptions{Limit: eventstore.ReadLimitMax, Types: []string{chaosmodel.EventType}})
		if err != nil {
			return nil, nil, fmt.Errorf("read the event store: %w", err)
		}
		if len(events) == 0 {
			return out, contents, nil
		}
		for _, e := range events {
			var p chaosmodel.Payload
			if err := json.Unmarshal(e.Payload, &p); err != nil {
				return nil, nil, fmt.Errorf("event %s: %w", e.ID, err)
			}
			out[e.ID] = e.RecordedAt
			contents[e.ID] = content{Stream: e.StreamID, Version: e.StreamVersion, Writer: p.Writer, Seq: p.Seq}
		}
		after = events[len(events)-1].Position
	}
}

// readTable reads a read-model table: event id, applications, first application time,
// content and application order.
func readTable(ctx context.Context, db *pgxpool.Pool, query string) (map[uuid.UUID]sighting, error) {
	rows, err := db.Query(ctx, query)
	if err != nil {
		return nil, err
	}
	out := map[uuid.UUID]sighting{}
	var (
		id uuid.UUID
		s  sighting
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &s.Count, &s.First, &s.Content.Stream, &s.Content.Version, &s.Content.Writer, &s.Content.Seq, &s.Order},
		func() error {
			out[id] = s
			return nil
		})
	return out, err
}

// readExact reads the exactly-once model.
func readExact(ctx context.Context, db *pgxpool.Pool) (map[uuid.UUID]sighting, error) {
	return readTable(ctx, db, `SELECT event_id, times, projected_at, stream_id, version, writer, seq, applied FROM `+chaosmodel.ExactProjection)
}

// readIdempotent reads the at-least-once table model.
func readIdempotent(ctx context.Context, db *pgxpool.Pool) (map[uuid.UUID]sighting, error) {
	return readTable(ctx, db, `SELECT event_id, deliveries, first_at, stream_id, version, writer, seq, applied FROM `+chaosmodel.IdempotentProjection)
}

// readSinks reads every file of the file model in dir ("<event id> <unix nanoseconds>" lines)
// and returns the sightings and the number of torn lines.
func readSinks(dir string) (map[uuid.UUID]sighting, int, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.lines"))
	if err != nil {
		return nil, 0, err
	}
	out := map[uuid.UUID]sighting{}
	torn := 0
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, 0, err
		}
		n, err := parseSink(f, out)
		_ = f.Close()
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", name, err)
		}
		torn += n
	}
	return out, torn, nil
}

// parseSink adds the lines of one sink file to seen and returns how many lines it could not
// read: a process killed mid-write leaves at most its last line cut short.
func parseSink(r io.Reader, seen map[uuid.UUID]sighting) (int, error) {
	torn := 0
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			if !addSinkLine(line, seen) {
				torn++
			}
		}
		if err == io.EOF {
			return torn, nil
		}
		if err != nil {
			return torn, err
		}
	}
}

// addSinkLine records one complete line; false if the line is torn or malformed. The first
// application is the earliest line's; its time is the order.
func addSinkLine(text []byte, seen map[uuid.UUID]sighting) bool {
	l, ok := chaosmodel.ParseLine(text)
	if !ok {
		return false
	}
	s := seen[l.ID]
	if s.Count == 0 || l.At.Before(s.First) {
		s.First, s.Order = l.At, l.At.UnixNano()
		s.Content = content{Stream: l.Stream, Version: l.Version, Writer: l.Writer, Seq: l.Seq}
	}
	s.Count++
	seen[l.ID] = s
	return true
}
