// Package memory keeps projection positions and status in memory, for the memory event store:
// the embedded demo and fast tests. Nothing survives the process.
//
// There is no database transaction, so only projections with OnIdempotent handlers can run
// here (at-least-once delivery); Register refuses projections with On handlers.
package memory

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nudgeworks/nudge/eventstore"
	memstore "github.com/nudgeworks/nudge/eventstore/memory"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/internal/seal"
)

// Backend is the in-memory projection.Backend, safe for concurrent use.
type Backend struct {
	store *memstore.Store
	now   func() time.Time

	mu       sync.Mutex
	rows     map[string]*row
	versions map[string]map[int]*version // by projection (Projection.Base), then version
	parts    map[string]int              // partition counts of partitioned projections, by unit name
}

type row struct {
	lock chan struct{} // a one-slot semaphore: the projection's lock, honouring contexts

	mu      sync.Mutex // guards status, parked and the attempt fields, so Status can read while a batch runs
	status  projection.Status
	parked  map[string]projection.ParkedStream
	attempt struct {
		at      eventstore.Position
		starts  int
		careful eventstore.Position
	}
}

func (r *row) get() projection.Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status
}

// parkedCopy returns a copy of the parked streams.
func (r *row) parkedCopy() map[string]projection.ParkedStream {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.parked)
}

// applyParking applies out's changes to the parked streams. The caller holds r.mu.
func (r *row) applyParking(out projection.Outcome) {
	if r.parked == nil {
		r.parked = make(map[string]projection.ParkedStream)
	}
	if ps := out.Park; ps != nil {
		r.parked[ps.StreamID] = *ps
	}
	for id, h := range out.Held {
		if ps, ok := r.parked[id]; ok {
			ps.Held += h.Events
			ps.LastHeld = h.Last
			r.parked[id] = ps
		}
	}
	for _, u := range out.Unpark {
		delete(r.parked, u.Stream.StreamID)
	}
	if f := out.ParkFailed; f != nil {
		if ps, ok := r.parked[f.StreamID]; ok {
			ps.Error, ps.Attempts = f.Err.Error(), ps.Attempts+1
			r.parked[f.StreamID] = ps
		}
	}
}

func (r *row) update(fn func(st *projection.Status)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fn(&r.status)
}

var _ projection.Backend = (*Backend)(nil)

// Config configures a Backend.
type Config struct {
	// NowFunc returns the current time for status timestamps. Defaults to time.Now.
	NowFunc func() time.Time
}

// ErrInvalidConfig is matched (errors.Is) by every error New returns for a Config or a store it
// cannot use; it also matches projection.ErrInvalidConfig.
var ErrInvalidConfig = fmt.Errorf("projection/memory: %w", projection.ErrInvalidConfig)

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

// New returns a backend that reads events from store.
func New(store *memstore.Store, cfg Config) (*Backend, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: New needs a memory event store (eventstore/memory.New)", ErrInvalidConfig)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Backend{store: store, now: cfg.NowFunc, rows: make(map[string]*row), versions: make(map[string]map[int]*version),
		parts: make(map[string]int)}, nil
}

// locked runs fn holding the projection's lock.
func (b *Backend) locked(ctx context.Context, name string, fn func(r *row) error) error {
	b.mu.Lock()
	r, ok := b.rows[name]
	b.mu.Unlock()
	if !ok {
		return fmt.Errorf("projection %s: %w", name, projection.ErrNotRegistered)
	}
	select {
	case r.lock <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-r.lock }()
	return fn(r)
}

// Register implements projection.Backend.
func (b *Backend) Register(ctx context.Context, p *projection.Projection, init projection.HookFunc) error {
	if p.Transactional() {
		return fmt.Errorf("projection %s: %w: use projection.OnIdempotent handlers with the memory backend, or the PostgreSQL backend",
			p.Name(), projection.ErrNeedsTransaction)
	}
	b.mu.Lock()
	if err := b.checkPartitions(p); err != nil {
		b.mu.Unlock()
		return err
	}
	state := b.registerVersion(p)
	if p.Partitioned() {
		b.parts[p.Name()] = p.Partitions()
	}
	for _, u := range p.Units() {
		if _, ok := b.rows[u.Name()]; !ok {
			b.rows[u.Name()] = &row{
				lock:   make(chan struct{}, 1),
				status: projection.Status{Name: u.Name(), State: projection.StateRunning, UpdatedAt: b.now()},
			}
		}
	}
	b.mu.Unlock()
	if init == nil || state == projection.VersionRetired {
		return nil
	}
	return b.lockedUnits(ctx, unitNames(p), func() error { return init(ctx, nil) })
}

// checkPartitions refuses p when its projection was registered with another partition count.
// The caller holds b.mu.
func (b *Backend) checkPartitions(p *projection.Projection) error {
	registered := b.parts[p.Name()]
	if _, ok := b.rows[p.Name()]; ok && registered == 0 {
		registered = 1
	}
	if registered != 0 && registered != p.Partitions() {
		return &projection.PartitionCountError{Projection: p.Name(), Registered: registered, Configured: p.Partitions()}
	}
	return nil
}

// unitNames returns the names of p's units, in order.
func unitNames(p *projection.Projection) []string {
	var names []string
	for _, u := range p.Units() {
		names = append(names, u.Name())
	}
	return names
}

// rowsOf returns the rows of p's units, in order; the caller holds their locks.
func (b *Backend) rowsOf(p *projection.Projection) ([]*row, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var rows []*row
	for _, u := range p.Units() {
		r, ok := b.rows[u.Name()]
		if !ok {
			return nil, fmt.Errorf("projection %s: %w", u.Name(), projection.ErrNotRegistered)
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// lockedAll runs fn holding the locks of all of p's units (one per partition), in order.
func (b *Backend) lockedAll(ctx context.Context, p *projection.Projection, fn func(rows []*row) error) error {
	if _, err := b.rowsOf(p); err != nil {
		return err
	}
	return b.lockedUnits(ctx, unitNames(p), func() error {
		rows, err := b.rowsOf(p)
		if err != nil {
			return err
		}
		return fn(rows)
	})
}

// runHook runs the runner's hook, if any, before the state change: a failing hook leaves the
// status as it was. There is no transaction to give it.
func runHook(ctx context.Context, hook projection.HookFunc) error {
	if hook == nil {
		return nil
	}
	return hook(ctx, nil)
}

// Seal implements projection.Backend.
func (*Backend) Seal(seal.Token) {}

// RunBatch implements projection.Backend.
func (b *Backend) RunBatch(ctx context.Context, p *projection.Projection, _ *projection.ReadAhead, fn projection.BatchFunc) error {
	return b.locked(ctx, p.Name(), func(r *row) error {
		var releases []func() // the active version's locks a claim took
		ver, err := b.versionInfo(ctx, p)
		if err != nil {
			return err
		}
		u := b.unit(r, ver)
		u.Claim = func(ctx context.Context) (projection.VersionInfo, error) {
			if release := b.claim(ctx, p, &ver); release != nil {
				releases = append(releases, release)
			}
			return ver, nil
		}
		defer func() {
			for _, release := range releases {
				release()
			}
		}()
		out, err := fn(ctx, u)
		if err != nil {
			return err
		}
		b.apply(r, out)
		return nil
	})
}

// unit is the projection.Unit of a batch on r.
func (b *Backend) unit(r *row, ver projection.VersionInfo) projection.Unit {
	return projection.Unit{Status: r.get(), Read: b.store.Read, ReadStream: b.store.ReadStream, Parked: r.parkedCopy(), Version: ver}
}

// apply stores a batch's outcome on r.
func (b *Backend) apply(r *row, out projection.Outcome) {
	if out.CommitClock != nil {
		*out.CommitClock = b.now()
	}
	r.update(func(st *projection.Status) {
		r.applyParking(out)
		if out.Skip != nil {
			skip := *out.Skip
			st.LastSkip = &skip
		}
		if out.Processed == 0 && out.Position == st.Position && out.State == st.State && !out.ClearFailure {
			return
		}
		st.Position, st.State = out.Position, out.State
		st.EventsProcessed += int64(out.Processed)
		r.attempt.at, r.attempt.starts = eventstore.Position{}, 0
		if !st.Position.Less(r.attempt.careful) {
			r.attempt.careful = eventstore.Position{}
		}
		if out.ClearFailure {
			st.LastError, st.FailingEvent, st.Attempts = "", nil, 0
			st.FirstFailureAt, st.LastFailureAt = time.Time{}, time.Time{}
		}
		st.UpdatedAt = b.now()
	})
}

// RecordFailure implements projection.Backend.
func (b *Backend) RecordFailure(ctx context.Context, p *projection.Projection, f projection.Failure) error {
	return b.locked(ctx, p.Name(), func(r *row) error {
		r.update(func(st *projection.Status) {
			e := f.Event
			if !st.Position.Less(e.Position) {
				return // handled meanwhile
			}
			if st.State != projection.StatePaused {
				st.State = projection.StateFailing
			}
			if st.FailingEvent != nil && st.FailingEvent.ID == e.ID {
				st.Attempts++
			} else {
				st.Attempts, st.FirstFailureAt = 1, f.At
			}
			st.FailingEvent = &e
			st.LastError, st.LastFailureAt, st.UpdatedAt = f.Err.Error(), f.At, b.now()
		})
		return nil
	})
}

// Reset implements projection.Backend.
// A partitioned projection's partitions are all reset, holding all their locks; the hook runs
// once.
func (b *Backend) Reset(ctx context.Context, p *projection.Projection, hook projection.HookFunc) error {
	return b.lockedAll(ctx, p, func(rows []*row) error {
		if err := runHook(ctx, hook); err != nil {
			return err
		}
		now := b.now()
		for _, r := range rows {
			r.update(func(st *projection.Status) {
				*st = projection.Status{Name: st.Name, State: projection.StateRebuilding, RebuildStartedAt: now, UpdatedAt: now,
					StateChangedBy: st.StateChangedBy, StateChangedAt: st.StateChangedAt}
				r.parked = nil // a rebuild handles every stream again
				r.attempt.at, r.attempt.starts, r.attempt.careful = eventstore.Position{}, 0, eventstore.Position{}
			})
		}
		return nil
	})
}

// SetState implements projection.Backend.
func (b *Backend) SetState(ctx context.Context, p *projection.Projection, to projection.State, from ...projection.State) (bool, error) {
	return b.SetStateBy(ctx, p, "", to, from...)
}

// SetStateBy implements projection.Backend.
func (b *Backend) SetStateBy(ctx context.Context, p *projection.Projection, by string, to projection.State, from ...projection.State) (bool, error) {
	var changed bool
	err := b.lockedAll(ctx, p, func(rows []*row) error {
		now := b.now() // one time for every unit, as one transaction's now() in PostgreSQL
		for _, r := range rows {
			r.update(func(st *projection.Status) {
				if st.State == to || (len(from) > 0 && !slices.Contains(from, st.State)) {
					return
				}
				changed = true
				if to == projection.StatePaused || st.State == projection.StatePaused {
					st.StateChangedBy, st.StateChangedAt = by, now
				}
				st.State, st.UpdatedAt = to, now
			})
		}
		return nil
	})
	return changed, err
}

// Delete implements projection.Backend.
func (b *Backend) Delete(ctx context.Context, p *projection.Projection, hook projection.HookFunc) error {
	err := b.lockedAll(ctx, p, func([]*row) error { return runHook(ctx, hook) })
	if err != nil {
		return err
	}
	b.mu.Lock()
	for _, u := range p.Units() {
		delete(b.rows, u.Name())
	}
	delete(b.parts, p.Name())
	delete(b.versions[p.Base()], p.Version())
	b.mu.Unlock()
	return nil
}

// Status implements projection.Backend.
func (b *Backend) Status(ctx context.Context, p *projection.Projection) (projection.Status, error) {
	b.mu.Lock()
	r, ok := b.rows[p.Name()]
	b.mu.Unlock()
	if !ok {
		return projection.Status{}, fmt.Errorf("projection %s: %w", p.Name(), projection.ErrNotRegistered)
	}
	// The projection's lock is not taken: a status read does not wait for a batch in flight.
	st := r.get()
	b.versionStatus(p, &st)
	if part := p.Partition(); part.Partitioned() {
		st.PartitionOf, st.Partition = p.Definition().Name(), part
	}
	for _, ps := range r.parkedCopy() {
		st.ParkedStreams++
		if st.OldestParkedAt.IsZero() || ps.ParkedAt.Before(st.OldestParkedAt) {
			st.OldestParkedAt = ps.ParkedAt
		}
	}
	head, err := b.store.Head(ctx)
	if err != nil {
		return st, err
	}
	st.Head = head
	after := st.Position
	for {
		page, err := b.store.Read(ctx, after, eventstore.ReadOptions{Limit: eventstore.ReadLimitMax, Types: p.Types(), Partition: p.Partition()})
		if err != nil {
			return st, err
		}
		if len(page) == 0 {
			break
		}
		if st.LagEvents == 0 {
			st.LagTime = max(b.now().Sub(page[0].RecordedAt), 0)
		}
		st.LagEvents += int64(len(page))
		after = page[len(page)-1].Position
	}
	return st, nil
}

// Parked implements projection.Backend.
func (b *Backend) Parked(_ context.Context, p *projection.Projection) ([]projection.ParkedStream, error) {
	b.mu.Lock()
	r, ok := b.rows[p.Name()]
	b.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("projection %s: %w", p.Name(), projection.ErrNotRegistered)
	}
	out := slices.Collect(maps.Values(r.parkedCopy()))
	slices.SortFunc(out, func(a, b projection.ParkedStream) int {
		return cmp.Or(a.Event.Position.Compare(b.Event.Position), strings.Compare(a.StreamID, b.StreamID))
	})
	return out, nil
}

// StartAttempt implements projection.Backend.
func (b *Backend) StartAttempt(_ context.Context, p *projection.Projection, at, careful eventstore.Position) (projection.Attempt, error) {
	b.mu.Lock()
	r, ok := b.rows[p.Name()]
	b.mu.Unlock()
	if !ok {
		return projection.Attempt{}, fmt.Errorf("projection %s: %w", p.Name(), projection.ErrNotRegistered)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case !careful.IsZero():
		r.attempt.starts, r.attempt.careful = 1, careful
	case r.attempt.starts > 0 && r.attempt.at == at:
		r.attempt.starts++
	default:
		r.attempt.starts = 1
	}
	r.attempt.at = at
	return projection.Attempt{Starts: r.attempt.starts, CarefulUntil: r.attempt.careful}, nil
}

// EndAttempt implements projection.Backend.
func (b *Backend) EndAttempt(_ context.Context, p *projection.Projection, at *eventstore.Position) error {
	b.mu.Lock()
	r, ok := b.rows[p.Name()]
	b.mu.Unlock()
	if !ok {
		return fmt.Errorf("projection %s: %w", p.Name(), projection.ErrNotRegistered)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if at == nil || r.attempt.at == *at {
		r.attempt.at, r.attempt.starts = eventstore.Position{}, 0
	}
	return nil
}
