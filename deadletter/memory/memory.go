// Package memory is an in-memory deadletter.Store for the embedded demo and fast tests.
//
// It keeps the same contract as deadletter/postgres (the deadletter/deadlettertest suite checks
// both), including folding, but nothing survives the process.
package memory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/deadletter/internal/clean"
	"github.com/nudgeworks/nudge/deadletter/internal/dlstore"
	"github.com/nudgeworks/nudge/eventstore"
)

// Config configures a Store.
type Config struct {
	// NowFunc is the store's clock: Record.UpdatedAt and the default Entry.At and
	// PurgeOptions.Now. Defaults to time.Now.
	NowFunc func() time.Time
}

// Store is an in-memory dead-letter store, safe for concurrent use. Create one with New.
type Store struct {
	now func() time.Time

	mu      sync.Mutex
	lastID  int64
	records map[int64]*deadletter.Record
	ids     []int64           // every record's ID, ascending
	open    map[foldKey]int64 // the record each unresolved fold key folds into
}

type foldKey struct{ projection, key string }

var _ deadletter.Store = (*Store)(nil)

// ErrInvalidConfig is matched (errors.Is) by every error Validate returns for a Config that
// cannot work; the message names the field and what to do.
var ErrInvalidConfig = errors.New("deadletter/memory: invalid config")

// WithDefaults returns cfg with every zero field that has a default set to it.
func (cfg Config) WithDefaults() Config {
	if cfg.NowFunc == nil {
		cfg.NowFunc = time.Now
	}
	return cfg
}

// Validate reports what is wrong with cfg (after WithDefaults), as an error matching
// ErrInvalidConfig.
func (cfg Config) Validate() error {
	if cfg.NowFunc == nil {
		return fmt.Errorf("%w: NowFunc is nil; leave it out for time.Now (call WithDefaults first)", ErrInvalidConfig)
	}
	return nil
}

// New returns an empty store. It returns no error: every Config is valid once WithDefaults has
// filled it in, which New does.
func New(cfg Config) *Store {
	cfg = cfg.WithDefaults()
	return &Store{
		now:     cfg.NowFunc,
		records: make(map[int64]*deadletter.Record),
		open:    make(map[foldKey]int64),
	}
}

// Add implements deadletter.Store.
func (s *Store) Add(ctx context.Context, e deadletter.Entry) (deadletter.Record, error) {
	if err := ctx.Err(); err != nil {
		return deadletter.Record{}, err
	}
	now := s.clock()
	e, err := dlstore.NormalizeEntry(e, now)
	if err != nil {
		return deadletter.Record{}, err
	}
	key := foldKey{e.Projection, dlstore.FoldKey(e)}

	s.mu.Lock()
	defer s.mu.Unlock()
	if id, ok := s.open[key]; ok {
		r := s.records[id]
		r.MessageUUID, r.Payload, r.Metadata, r.Error = e.MessageUUID, e.Payload, e.Metadata, e.Error
		if r.FailingEvent != nil && r.FailingEvent.StreamID == "" {
			r.FailingEvent.StreamID = e.FailingEvent.StreamID // kept once known, as in PostgreSQL
		}
		r.Attempts += e.Attempts
		r.Count++
		if e.At.Before(r.FirstFailedAt) {
			r.FirstFailedAt = e.At
		}
		if e.At.After(r.LastFailedAt) {
			r.LastFailedAt = e.At
		}
		r.Status = deadletter.StatusFailed
		r.UpdatedAt = now
		return dlstore.CloneRecord(*r), nil
	}
	s.lastID++
	r := &deadletter.Record{
		ID:            s.lastID,
		Projection:    e.Projection,
		MessageUUID:   e.MessageUUID,
		Payload:       e.Payload,
		Metadata:      e.Metadata,
		Error:         e.Error,
		FailingEvent:  e.FailingEvent,
		Attempts:      e.Attempts,
		Count:         1,
		FirstFailedAt: e.At,
		LastFailedAt:  e.At,
		Status:        deadletter.StatusFailed,
		UpdatedAt:     now,
	}
	s.records[r.ID] = r
	s.ids = append(s.ids, r.ID)
	s.open[key] = r.ID
	return dlstore.CloneRecord(*r), nil
}

// Get implements deadletter.Store.
func (s *Store) Get(ctx context.Context, id int64) (deadletter.Record, error) {
	if err := ctx.Err(); err != nil {
		return deadletter.Record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.records[id]
	if !ok {
		return deadletter.Record{}, notFound(id)
	}
	return dlstore.CloneRecord(*r), nil
}

// List implements deadletter.Store.
func (s *Store) List(ctx context.Context, f deadletter.Filter) ([]deadletter.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f, err := dlstore.NormalizeFilter(f)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	start, _ := slices.BinarySearch(s.ids, f.AfterID+1)
	var out []deadletter.Record
	for _, id := range s.ids[start:] {
		if len(out) == f.Limit {
			break
		}
		if r := s.records[id]; dlstore.Matches(f, *r) {
			out = append(out, dlstore.CloneRecord(*r))
		}
	}
	return out, nil
}

// MarkReplayed implements deadletter.Store.
func (s *Store) MarkReplayed(ctx context.Context, ids []int64, by string, at time.Time) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	by, err := dlstore.NormalizeActor("MarkReplayed's by", by)
	if err != nil {
		return 0, err
	}
	now := s.clock()
	if at.IsZero() {
		at = now
	}
	at = clean.Time(at)
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := 0
	seen := make(map[int64]bool, len(ids))
	for _, id := range ids {
		r, ok := s.records[id]
		if !ok || seen[id] || !r.Status.Replayable() {
			continue
		}
		seen[id] = true
		r.Status, r.ReplayedBy, r.ReplayedAt, r.UpdatedAt = deadletter.StatusReplayed, by, at, now
		r.Replays++
		changed++
	}
	return changed, nil
}

// Resolve implements deadletter.Store.
func (s *Store) Resolve(ctx context.Context, id int64, by, note string, at time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	by, err := dlstore.NormalizeActor("Resolve's by", by)
	if err != nil {
		return err
	}
	now := s.clock()
	if at.IsZero() {
		at = now
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.records[id]
	if !ok {
		return notFound(id)
	}
	if r.Status == deadletter.StatusResolved {
		return nil
	}
	r.Status, r.ResolvedBy, r.ResolveNote = deadletter.StatusResolved, by, clean.Text(note)
	r.ResolvedAt, r.UpdatedAt = clean.Time(at), now
	delete(s.open, keyOf(r))
	return nil
}

// ResolvePassed implements deadletter.Store.
func (s *Store) ResolvePassed(ctx context.Context, projection string, passed eventstore.Position, at time.Time) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := dlstore.NormalizePassed(projection); err != nil {
		return 0, err
	}
	now := s.clock()
	if at.IsZero() {
		at = now
	}
	at = clean.Time(at)
	note := dlstore.HealedNote(passed, at)
	s.mu.Lock()
	defer s.mu.Unlock()
	healed := 0
	for _, id := range s.ids {
		r := s.records[id]
		if r.Projection != projection || r.Status != deadletter.StatusFailed || r.FailingEvent == nil || r.Metadata[deadletter.MetadataTransient] == "" || passed.Less(r.FailingEvent.Position) {
			continue
		}
		r.Status, r.ResolvedBy, r.ResolveNote, r.ResolvedAt, r.UpdatedAt = deadletter.StatusResolved, deadletter.HealedBy, note, at, now
		delete(s.open, keyOf(r))
		healed++
	}
	return healed, nil
}

// Purge implements deadletter.Store.
func (s *Store) Purge(ctx context.Context, opts deadletter.PurgeOptions) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	opts, err := dlstore.NormalizePurge(opts, s.clock())
	if err != nil {
		return 0, err
	}
	cutoff := dlstore.Cutoff(opts)
	s.mu.Lock()
	defer s.mu.Unlock()
	purged := 0
	s.ids = slices.DeleteFunc(s.ids, func(id int64) bool {
		r := s.records[id]
		if !r.LastFailedAt.Before(cutoff) || (r.Status != deadletter.StatusResolved && !opts.IncludeUnresolved) {
			return false
		}
		delete(s.records, id)
		if key := keyOf(r); s.open[key] == id {
			delete(s.open, key)
		}
		purged++
		return true
	})
	return purged, nil
}

// clock is the store's time, as records keep it.
func (s *Store) clock() time.Time { return clean.Time(s.now()) }

// keyOf is the fold key of a stored record.
func keyOf(r *deadletter.Record) foldKey {
	return foldKey{r.Projection, dlstore.FoldKey(deadletter.Entry{FailingEvent: r.FailingEvent, MessageUUID: r.MessageUUID})}
}

func notFound(id int64) error {
	return &deadletter.NotFoundError{ID: id}
}
