// Package memory is an in-memory eventstore.Store for the embedded demo and fast tests.
//
// It keeps the same contract as eventstore/postgres (the eventstore/storetest suite checks
// both) but nothing survives the process. Every append is atomic and takes the next commit
// number as its Position.TransactionID, so read order equals commit order and Read never skips.
package memory

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/storecheck"
)

// Store is an in-memory event store, safe for concurrent use. The zero value is not usable:
// create one with New.
type Store struct {
	now    func() time.Time
	limits eventstore.Limits

	mu      sync.RWMutex
	events  []eventstore.Event // in read order
	streams map[string][]int   // stream id → indexes into events, in version order
	byID    map[uuid.UUID]int  // event id → index into events
	commits uint64             // last commit number handed out
}

// Config configures a Store.
type Config struct {
	// NowFunc returns the time recorded on appended events. Defaults to time.Now.
	NowFunc func() time.Time
	// Limits bound each append as in eventstore/postgres; zero fields take their defaults
	// (eventstore.MaxEventBytesDefault, 1 MiB; MaxAppendBytesDefault, 16 MiB;
	// MaxAppendEventsDefault, 10,000). An append beyond them fails with eventstore.ErrTooLarge.
	Limits eventstore.Limits
}

// ErrInvalidConfig is matched (errors.Is) by every error New returns for a Config it cannot
// use; the message names the field and what to do. An error about Limits also carries the
// *eventstore.ValidationError values of eventstore.Limits.Validate.
var ErrInvalidConfig = errors.New("memory event store: invalid config")

// WithDefaults returns cfg with every zero field that has a default set to it.
func (cfg Config) WithDefaults() Config {
	if cfg.NowFunc == nil {
		cfg.NowFunc = time.Now
	}
	cfg.Limits = cfg.Limits.WithDefaults()
	return cfg
}

// Validate reports what is wrong with cfg (after WithDefaults), as an error matching
// ErrInvalidConfig.
func (cfg Config) Validate() error {
	if cfg.NowFunc == nil {
		return fmt.Errorf("%w: NowFunc is nil; leave it out for time.Now (call WithDefaults first)", ErrInvalidConfig)
	}
	if err := cfg.Limits.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// New returns an empty store.
func New(cfg Config) (*Store, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Store{
		now:     cfg.NowFunc,
		limits:  cfg.Limits,
		streams: make(map[string][]int),
		byID:    make(map[uuid.UUID]int),
	}, nil
}

var _ eventstore.Store = (*Store)(nil)

// Append implements eventstore.Store.
func (s *Store) Append(ctx context.Context, streamID string, expected eventstore.ExpectedVersion, events ...eventstore.EventData) (eventstore.AppendResult, error) {
	if err := ctx.Err(); err != nil {
		return eventstore.AppendResult{}, err
	}
	if err := storecheck.Append(streamID, expected, events, s.limits); err != nil {
		return eventstore.AppendResult{}, err
	}

	s.mu.Lock()
	defer s.mu.Unlock()

	current := int64(len(s.streams[streamID]))
	if res, done, err := s.repeated(streamID, events); done {
		return res, err
	}
	if !expected.Check(current) {
		return eventstore.AppendResult{}, &eventstore.WrongExpectedVersionError{StreamID: streamID, Expected: expected, Actual: current}
	}

	s.commits++
	recorded := s.now().UTC()
	res := eventstore.AppendResult{Events: make([]eventstore.Event, 0, len(events))}
	for i, data := range events {
		id := data.ID
		if id == uuid.Nil {
			id = uuid.Must(uuid.NewV7())
		}
		e := eventstore.Event{
			ID:            id,
			StreamID:      streamID,
			StreamVersion: current + int64(i) + 1,
			Type:          data.Type,
			Payload:       bytes.Clone(data.Payload),
			Metadata:      bytes.Clone(data.Metadata),
			RecordedAt:    recorded,
			Position: eventstore.Position{
				TransactionID:  s.commits,
				GlobalPosition: int64(len(s.events)) + 1,
			},
		}
		s.byID[id] = len(s.events)
		s.streams[streamID] = append(s.streams[streamID], len(s.events))
		s.events = append(s.events, e)
		res.Events = append(res.Events, copyEvent(e))
	}
	res.StreamVersion = current + int64(len(events))
	return res, nil
}

// repeated checks the append's event ids against stored ones. It reports done when the ids
// decide the outcome: an exact repeat of an earlier append (idempotent success) or a clash.
// Callers hold s.mu.
func (s *Store) repeated(streamID string, events []eventstore.EventData) (eventstore.AppendResult, bool, error) {
	var found []eventstore.Event
	for _, data := range events {
		if data.ID == uuid.Nil {
			continue
		}
		if idx, ok := s.byID[data.ID]; ok {
			found = append(found, s.events[idx])
		}
	}
	if len(found) == 0 {
		return eventstore.AppendResult{}, false, nil
	}
	if err := storecheck.Repeat(streamID, events, found); err != nil {
		return eventstore.AppendResult{}, true, err
	}
	res := eventstore.AppendResult{Idempotent: true, StreamVersion: found[len(found)-1].StreamVersion}
	for _, e := range found {
		res.Events = append(res.Events, copyEvent(e))
	}
	return res, true, nil
}

// Limits returns the limits the store applies to appends, defaults filled in.
func (s *Store) Limits() eventstore.Limits { return s.limits }

// Read implements eventstore.Store.
func (s *Store) Read(ctx context.Context, after eventstore.Position, opts eventstore.ReadOptions) ([]eventstore.Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	limit, err := storecheck.ReadOptions(opts)
	if err != nil {
		return nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	// Events are stored in read order; find the first one after the position.
	start, _ := slices.BinarySearchFunc(s.events, after, func(e eventstore.Event, p eventstore.Position) int {
		if e.Position.Compare(p) <= 0 {
			return -1
		}
		return 1
	})
	var out []eventstore.Event
	for _, e := range s.events[start:] {
		if len(out) == limit {
			break
		}
		if len(opts.Types) > 0 && !slices.Contains(opts.Types, e.Type) {
			continue
		}
		if opts.Partition.Partitioned() && !opts.Partition.Contains(e.StreamID) {
			continue
		}
		if opts.OmitPayload {
			e.Payload, e.Metadata = nil, nil
			out = append(out, e)
			continue
		}
		out = append(out, copyEvent(e))
	}
	return out, nil
}

// ReadStream implements eventstore.Store.
func (s *Store) ReadStream(ctx context.Context, streamID string, afterVersion int64, limit int) ([]eventstore.Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := storecheck.StreamID(streamID); err != nil {
		return nil, err
	}
	limit, err := storecheck.Limit(limit)
	if err != nil {
		return nil, err
	}
	afterVersion = max(afterVersion, 0)
	s.mu.RLock()
	defer s.mu.RUnlock()
	idx := s.streams[streamID]
	if afterVersion >= int64(len(idx)) {
		return nil, nil
	}
	idx = idx[afterVersion:]
	out := make([]eventstore.Event, 0, min(len(idx), limit))
	for _, i := range idx[:min(len(idx), limit)] {
		out = append(out, copyEvent(s.events[i]))
	}
	return out, nil
}

// Head implements eventstore.Store.
func (s *Store) Head(ctx context.Context) (eventstore.Position, error) {
	if err := ctx.Err(); err != nil {
		return eventstore.Position{}, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if len(s.events) == 0 {
		return eventstore.Position{}, nil
	}
	return s.events[len(s.events)-1].Position, nil
}

// HeadPartition is Head for one partition of the log: the position of the newest event of
// partition p that Read can return now (the zero Position when the partition has none). An
// unpartitioned p gives Head. An invalid p fails with a *eventstore.ValidationError.
func (s *Store) HeadPartition(ctx context.Context, p eventstore.Partition) (eventstore.Position, error) {
	if err := ctx.Err(); err != nil {
		return eventstore.Position{}, err
	}
	if err := p.Validate(); err != nil {
		return eventstore.Position{}, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	for i := len(s.events) - 1; i >= 0; i-- {
		if p.Contains(s.events[i].StreamID) {
			return s.events[i].Position, nil
		}
	}
	return eventstore.Position{}, nil
}

func copyEvent(e eventstore.Event) eventstore.Event {
	e.Payload = bytes.Clone(e.Payload)
	e.Metadata = bytes.Clone(e.Metadata)
	return e
}
