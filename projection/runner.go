package projection

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/tracing"
)

// RunnerConfig configures a Runner. Every field is optional.
type RunnerConfig struct {
	// Logger receives the runner's structured logs; every line carries the projection name.
	// Defaults to slog.Default().
	Logger *slog.Logger
	// NowFunc returns the current time. Defaults to time.Now.
	NowFunc func() time.Time
	// OnBatch, if set, is called after every batch that committed events or failed (not for
	// empty reads, pauses or shutdowns), on the catching-up goroutine: keep it fast. Package
	// metrics uses it for its batch counters and durations.
	OnBatch func(BatchReport)
	// OnCatchUp, if set, is called after every CatchUp with its name, result and error, on the
	// catching-up goroutine: keep it fast.
	OnCatchUp func(name string, res Result, err error)
	// TracerProvider receives a span per batch, linked to the appends of its events, and per
	// cut-over and redrive. Defaults to otel.GetTracerProvider() (a no-op unless the
	// application sets one).
	TracerProvider trace.TracerProvider
}

// WithDefaults returns cfg with every zero field that has a default set to it.
func (cfg RunnerConfig) WithDefaults() RunnerConfig {
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	if cfg.NowFunc == nil {
		cfg.NowFunc = time.Now
	}
	return cfg
}

// Validate reports what is wrong with cfg (after WithDefaults), as an error matching
// ErrInvalidConfig. Every RunnerConfig is valid once its defaults are filled in; Validate
// checks that they are.
func (cfg RunnerConfig) Validate() error {
	if cfg.Logger == nil || cfg.NowFunc == nil {
		return fmt.Errorf("%w: RunnerConfig needs a Logger and a NowFunc; call WithDefaults first", ErrInvalidConfig)
	}
	return nil
}

// BatchReport describes one batch, for RunnerConfig.OnBatch.
type BatchReport struct {
	Projection string
	// Events is the number of events the batch committed; 0 when it failed.
	Events int
	// Took is the batch's wall time, from its start to its commit or rollback.
	Took time.Duration
	// Position is the committed position after the batch.
	Position eventstore.Position
	// Err is nil for a committed batch, a *HandlerError when a handler failed on an event
	// (errors.Is(Err, ErrHandler)), and any other error when the batch could not run (the
	// database is down, say).
	Err error
	// Staleness holds, for each event a committed batch handled, the time from the event's
	// RecordedAt to the batch's commit, both read from the store's clock (Outcome.CommitClock;
	// the host's clock at the report when the backend gave none). RecordedAt is the time of the
	// append's INSERT, so this bounds the time from the event's commit to the batch's from
	// above, by what the append transaction did after the insert. Nil for a failed batch and
	// for the history a rebuild or a building version replays.
	Staleness []time.Duration
	// LockWait is the time from the batch's start to its unit of work running: taking a
	// connection, BEGIN and the wait for the projection's lock, which another runner's batch
	// of the same projection holds meanwhile.
	LockWait time.Duration
}

// Runner catches projections up: it reads each projection's events forward from the
// projection's own committed position, in batches, each batch one unit of work (one PostgreSQL
// transaction) that writes the read model and advances the position together.
//
// A Runner is safe for concurrent use, and any number of runners, in any number of processes,
// may catch up the same projection at once: the backend's lock serialises their batches, so
// every event is handled once per successful batch and the work is not duplicated.
type Runner struct {
	backend     Backend
	logger      *slog.Logger
	tracer      *tracing.Tracer
	now         func() time.Time
	onBatch     func(BatchReport)
	onCatchUp   func(string, Result, error)
	projections map[string]*Projection
	names       []string
	// parts are the partition units of the partitioned projections, by unit name.
	parts map[string]*Projection

	mu        sync.Mutex
	positions map[string]eventstore.Position // last committed position seen per unit
	running   map[string]chan struct{}       // one catch-up per unit at a time in this runner
}

// NewRunner returns a runner for projections on backend. Names must be unique. Call Init before
// the first catch-up.
func NewRunner(backend Backend, cfg RunnerConfig, projections ...*Projection) (*Runner, error) {
	if backend == nil {
		return nil, fmt.Errorf("%w: NewRunner needs a backend (projection/postgres or projection/memory), got nil", ErrInvalidConfig)
	}
	if len(projections) == 0 {
		return nil, fmt.Errorf("%w: NewRunner needs at least one projection", ErrInvalidConfig)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Runner{
		backend:     backend,
		logger:      tracing.Logger(cfg.Logger),
		tracer:      tracing.New(cfg.TracerProvider),
		now:         cfg.NowFunc,
		onBatch:     cfg.OnBatch,
		onCatchUp:   cfg.OnCatchUp,
		projections: make(map[string]*Projection, len(projections)),
		positions:   make(map[string]eventstore.Position, len(projections)),
		running:     make(map[string]chan struct{}, len(projections)),
		parts:       make(map[string]*Projection),
	}
	for i, p := range projections {
		if p == nil {
			return nil, fmt.Errorf("%w: projection %d is nil; create projections with projection.New", ErrInvalidConfig, i)
		}
		if _, dup := r.projections[p.name]; dup {
			return nil, fmt.Errorf("%w: two projections are named %s; names must be unique", ErrInvalidConfig, p.name)
		}
		r.projections[p.name] = p
		r.names = append(r.names, p.name)
		for _, u := range p.Units() {
			r.running[u.name] = make(chan struct{}, 1)
			if u != p {
				r.parts[u.name] = u
			}
		}
	}
	for name := range r.parts {
		if _, dup := r.projections[name]; dup {
			return nil, fmt.Errorf("%w: projection %s has the name of a partition of %s; rename it", ErrInvalidConfig, name, r.parts[name].parent.name)
		}
	}
	slices.Sort(r.names)
	return r, nil
}

// Names returns the runner's projection names, sorted.
func (r *Runner) Names() []string { return slices.Clone(r.names) }

// Projection returns the projection called name.
func (r *Runner) Projection(name string) (*Projection, error) {
	p, ok := r.projections[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q; this runner has %v", ErrUnknownProjection, name, r.names)
	}
	return p, nil
}

// partitionIndexer is a backend whose store needs an index before partitioned reads
// (projection/postgres: the event store's EnsurePartitions).
type partitionIndexer interface {
	EnsurePartitions(ctx context.Context, count int) error
}

// Init registers every projection with the backend (creating its status row, one per
// partition of a partitioned projection) and runs its init hook, once per projection. Run it
// at every start; it is idempotent. A partitioned projection's store index is made ready
// first (with PostgreSQL, built concurrently on the first start). A projection whose partition
// count changed is refused with a *PartitionCountError.
func (r *Runner) Init(ctx context.Context) error {
	for _, name := range r.names {
		p := r.projections[name]
		if ix, ok := r.backend.(partitionIndexer); ok && p.Partitioned() {
			if err := ix.EnsurePartitions(ctx, p.Partitions()); err != nil {
				return fmt.Errorf("projection %s: init: index the store for %d partitions: %w", name, p.Partitions(), err)
			}
		}
		if err := r.backend.Register(ctx, p, hook("init", p, p.cfg.InitFunc)); err != nil {
			return fmt.Errorf("projection %s: init: %w", name, err)
		}
	}
	return nil
}

// hook returns the projection's hook fn (InitFunc, ResetFunc or DeleteFunc) as the backend
// runs it, in the unit of work of the state change; nil when fn is nil. Its errors say which
// hook failed.
func hook(which string, p *Projection, fn func(context.Context, HookParams) error) HookFunc {
	if fn == nil {
		return nil
	}
	return func(ctx context.Context, tx pgx.Tx) error {
		if err := fn(ctx, HookParams{Projection: p.name, Tx: tx}); err != nil {
			return fmt.Errorf("%s hook: %w", which, err)
		}
		return nil
	}
}

// Result sums up a CatchUp.
type Result struct {
	// Events is the number of events handled and committed.
	Events int
	// Batches is the number of batches committed.
	Batches int
	// Position is the committed position when CatchUp returned.
	Position eventstore.Position
	// Paused is true when the projection is paused and nothing was done.
	Paused bool
	// Retired is true when the projection's version is retired (a newer version replaced
	// it) and nothing was done.
	Retired bool
	// Activated is true when the catch-up ended in the cut-over that made the projection's
	// version active; CutOverHeld is then how long the cut-over held the active version's
	// lock (the pause its batches, and readers of the views it replaced, saw).
	Activated   bool
	CutOverHeld time.Duration
	// Paced is how long a building version waited between its batches of history for the
	// active version's lag to come down (Config.BuildLagTarget).
	Paced time.Duration
	// Stopped is true when a BatchGuard (WithBatchGuard) ended the catch-up before it read
	// everything: the partition is being handed to another worker. Position is committed.
	Stopped bool

	building bool        // a batch ran a building version's history
	version  VersionInfo // the version record the last batch saw
}

// CatchUp handles the projection's events from its committed position until a read comes back
// with fewer events than the batch size (empty or short: everything readable was read). Each batch commits on its own; a failed batch is rolled back and the events before the
// failing one are committed in a batch of their own, so the position stops right before it.
// The failure is recorded in the status (state failing, the event, the error, attempts) and
// returned as a *HandlerError. A cancelled context rolls back the batch in flight, records
// nothing and returns the context's error.
//
// For a partitioned projection (Config.Partitions), CatchUp catches its partitions up in turn,
// in index order, and sums their results (Position is then the lowest partition's); a
// partition that fails does not stop the others, and their errors are returned joined. name
// may also be the unit name of one partition (PartitionUnitName), which CatchUpPartition
// catches up alone.
//
// WithBatchGuard makes the catch-up ask before each batch whether it may run one (see
// BatchGuard); each partition's catch-up asks it.
func (r *Runner) CatchUp(ctx context.Context, name string, opts ...CatchUpOption) (Result, error) {
	guard := catchUpGuard(opts)
	if p, ok := r.projections[name]; ok && p.Partitioned() {
		return r.catchUpPartitions(ctx, p, guard)
	}
	return r.catchUpUnit(ctx, name, guard)
}

// catchUpUnit catches up the unit called name (a projection or a partition) and reports it.
func (r *Runner) catchUpUnit(ctx context.Context, name string, guard BatchGuard) (Result, error) {
	res, err := r.catchUp(ctx, name, guard)
	if r.onCatchUp != nil {
		r.onCatchUp(name, res, err)
	}
	return res, err
}

func (r *Runner) catchUp(ctx context.Context, name string, guard BatchGuard) (Result, error) {
	p, err := r.unit(name)
	if err != nil {
		return Result{}, err
	}
	// Concurrent catch-ups of one unit in one runner (several triggers at once) would only
	// queue on the backend's lock, each holding a database connection meanwhile: they wait
	// here instead, and find the work done.
	select {
	case r.running[name] <- struct{}{}:
		defer func() { <-r.running[name] }()
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}
	var res Result
	pace := pacer{target: p.cfg.BuildLagTarget, batchSize: p.cfg.BatchSize}
	for round := 1; ; round++ {
		res.building = false
		if err := r.catchUpRounds(ctx, p, &res, guard, &pace); err != nil || res.Paused || res.Stopped {
			return res, err
		}
		if res.Paced > 0 {
			r.logger.DebugContext(ctx, "projection version build paced by the active version's lag", slog.String("projection", p.name),
				slog.Duration("waited", res.Paced), slog.Int("events", res.Events), slog.Int("batches", res.Batches))
		}
		switch {
		case res.building:
			// A cut-over that found another partition behind (its owner, here or in another
			// worker, is still building it) is tried again after one more catch-up, a few
			// times; then that partition's own catch-up, the next trigger or the safety net
			// tries it.
			behind, err := r.activate(ctx, p.Definition(), p, &res)
			if err != nil || !behind || round == cutOverRounds {
				return res, err
			}
			continue
		case res.Retired:
			return res, r.dropAfterGrace(ctx, p, res.version)
		case res.version.Undropped.Version > 0:
			r.dropTablesAfterGrace(ctx, p, res.version.Undropped)
		}
		return res, nil
	}
}

// cutOverRounds bounds the catch-ups of one CatchUp that end in a cut-over found behind.
const cutOverRounds = 3

// catchUpRounds runs p's batches until one reads everything readable, sums them up in res, and
// paces a building version's batches (pace): their size and the waits between them.
func (r *Runner) catchUpRounds(ctx context.Context, p *Projection, res *Result, guard BatchGuard, pace *pacer) error {
	defer func() { res.Paced = pace.waited }()
	for {
		started, events := r.now(), res.Events
		limit := p.cfg.BatchSize
		if res.version.State == VersionBuilding {
			limit = pace.batchLimit()
		}
		more, err := r.guardedStep(ctx, p, res, guard, limit)
		if err != nil || res.Paused || res.Stopped || !more {
			return err
		}
		if res.version.State == VersionBuilding {
			now := r.now()
			if err := r.sleep(ctx, pace.next(res.version, res.Events-events, now.Sub(started), res.Position, now)); err != nil {
				return err
			}
		}
	}
}

func (r *Runner) report(b BatchReport) {
	if r.onBatch != nil {
		r.onBatch(b)
	}
}

// remember caches a committed position seen for name. Batches of concurrent catch-ups finish
// in any order, so the cache only moves forward — unless the batch saw the projection rebuilding
// (reset, possibly by another process), which moves it back.
func (r *Runner) remember(name string, p eventstore.Position, rebuilding bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rebuilding || r.positions[name].Less(p) {
		r.positions[name] = p
	}
}

// CommittedPosition returns the last committed position this runner has seen for the
// projection, without asking the backend. A trigger for a position at or before it needs no
// read. It is the zero Position before the first catch-up and right after a Reset.
//
// For a partitioned projection it is the lowest of its partitions' (name may also be a
// partition's unit name).
func (r *Runner) CommittedPosition(name string) eventstore.Position {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.projections[name]
	if !ok || !p.Partitioned() {
		return r.positions[name]
	}
	low := r.positions[p.parts[0].name]
	for _, u := range p.parts[1:] {
		if at := r.positions[u.name]; at.Less(low) {
			low = at
		}
	}
	return low
}

// unit returns the unit called name: an unpartitioned projection, or a partition of a
// partitioned one. The definition of a partitioned projection is not a unit.
func (r *Runner) unit(name string) (*Projection, error) {
	if p, ok := r.parts[name]; ok {
		return p, nil
	}
	p, err := r.Projection(name)
	if err != nil {
		return nil, err
	}
	if p.Partitioned() {
		return nil, fmt.Errorf("%w: %s is partitioned; name one of its partitions (%s to %s) or use CatchUp", ErrUnknownProjection,
			name, p.parts[0].name, p.parts[len(p.parts)-1].name)
	}
	return p, nil
}

// forget drops the cached positions of p's units.
func (r *Runner) forget(p *Projection) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, u := range p.Units() {
		delete(r.positions, u.name)
	}
}

// Reset prepares a rebuild: it runs the projection's reset hook and sets its position back to
// the start and its state to rebuilding, in one unit of work. The next catch-up rebuilds the
// read model batch by batch (never holding more than one batch of events in memory) and returns
// the projection to running when it reaches the head. Status shows the progress.
func (r *Runner) Reset(ctx context.Context, name string) error {
	p, err := r.Projection(name)
	if err != nil {
		return err
	}
	if err := r.backend.Reset(ctx, p, hook("reset", p, p.cfg.ResetFunc)); err != nil {
		return fmt.Errorf("projection %s: reset: %w", name, err)
	}
	r.forget(p)
	r.logger.InfoContext(ctx, "projection reset for a rebuild", slog.String("projection", name))
	return nil
}

// Pause stops catch-up of the projection (in every process) until Resume. It is PauseBy
// naming nobody: the status records when, not who.
func (r *Runner) Pause(ctx context.Context, name string) error {
	return r.PauseBy(ctx, name, "")
}

// PauseBy is Pause recording by (an operator's name) and the time in the status
// (Status.StateChangedBy and StateChangedAt), as `nudge pause` and the console do. Pausing a
// paused projection changes nothing, and keeps who paused it.
func (r *Runner) PauseBy(ctx context.Context, name, by string) error {
	p, err := r.Projection(name)
	if err != nil {
		return err
	}
	changed, err := r.backend.SetStateBy(ctx, p, by, StatePaused)
	if err != nil {
		return fmt.Errorf("projection %s: pause: %w", name, err)
	}
	if changed {
		r.logger.InfoContext(ctx, "projection paused", slog.String("projection", name), slog.String("by", by))
	}
	return nil
}

// Resume lets a paused projection catch up again. Resuming a projection that is not paused
// changes nothing. It is ResumeBy naming nobody.
func (r *Runner) Resume(ctx context.Context, name string) error {
	return r.ResumeBy(ctx, name, "")
}

// ResumeBy is Resume recording by and the time in the status (Status.StateChangedBy and
// StateChangedAt), as `nudge resume` and the console do. It does not trigger a catch-up: the
// projection reads on at its next trigger, CatchUp or safety-net tick.
func (r *Runner) ResumeBy(ctx context.Context, name, by string) error {
	p, err := r.Projection(name)
	if err != nil {
		return err
	}
	changed, err := r.backend.SetStateBy(ctx, p, by, StateRunning, StatePaused)
	if err != nil {
		return fmt.Errorf("projection %s: resume: %w", name, err)
	}
	if changed {
		r.logger.InfoContext(ctx, "projection resumed", slog.String("projection", name), slog.String("by", by))
	}
	return nil
}

// Delete runs the projection's delete hook and removes its status row. Init creates it again.
// A projection deleted for good should leave the channel too: undeclare its subscription
// (channel.Undeclarer, on RabbitMQ and the PostgreSQL queue), or its queue keeps every trigger
// published from then on.
func (r *Runner) Delete(ctx context.Context, name string) error {
	p, err := r.Projection(name)
	if err != nil {
		return err
	}
	if err := r.backend.Delete(ctx, p, hook("delete", p, p.cfg.DeleteFunc)); err != nil {
		return fmt.Errorf("projection %s: delete: %w", name, err)
	}
	r.forget(p)
	return nil
}

// Status returns the projection's status and lag. A partitioned projection's status folds its
// partitions' (FoldPartitions), which it lists in Status.Partitions.
func (r *Runner) Status(ctx context.Context, name string) (Status, error) {
	p, err := r.Projection(name)
	if err != nil {
		return Status{}, err
	}
	return r.status(ctx, p)
}

// status returns p's status, folding its partitions' when it is partitioned.
func (r *Runner) status(ctx context.Context, p *Projection) (Status, error) {
	if !p.Partitioned() {
		return r.backend.Status(ctx, p)
	}
	parts := make([]Status, len(p.parts))
	for k, u := range p.parts {
		st, err := r.backend.Status(ctx, u)
		if err != nil {
			return Status{}, fmt.Errorf("partition %s: %w", u.name, err)
		}
		parts[k] = st
	}
	return FoldPartitions(p.name, parts), nil
}

// Statuses returns the status of every projection of the runner, sorted by name.
func (r *Runner) Statuses(ctx context.Context) ([]Status, error) {
	return r.StatusesOf(ctx, r.names...)
}

// statusesBackend is a Backend that computes the statuses of many projections at once, with
// what they share read once (the PostgreSQL backend).
type statusesBackend interface {
	StatusesOf(ctx context.Context, ps []*Projection) ([]Status, error)
}

// StatusesOf returns the statuses of the named projections, in order, as Status returns each.
// A backend that can (the PostgreSQL one) computes those of the projections that are not
// partitioned together, in a few statements whatever their number.
func (r *Runner) StatusesOf(ctx context.Context, names ...string) ([]Status, error) {
	out := make([]Status, len(names))
	var batch []*Projection
	var at []int
	for i, name := range names {
		p, err := r.Projection(name)
		if err != nil {
			return nil, err
		}
		if _, ok := r.backend.(statusesBackend); ok && !p.Partitioned() {
			batch, at = append(batch, p), append(at, i)
			continue
		}
		if out[i], err = r.status(ctx, p); err != nil {
			return nil, fmt.Errorf("projection %s: status: %w", name, err)
		}
	}
	if len(batch) == 0 {
		return out, nil
	}
	sts, err := r.backend.(statusesBackend).StatusesOf(ctx, batch)
	if err != nil {
		return nil, fmt.Errorf("projection: statuses: %w", err)
	}
	for k, i := range at {
		out[i] = sts[k]
	}
	return out, nil
}

// ClearCrashLoop lets the projection handle again an event it was judged to die on (after a
// fix): the next batch there runs the handler, one event at a time. Workers call it for replay
// triggers. It is bounded by the projection's BatchTimeout.
//
// name may be a partition's unit name: only that partition's verdict is cleared.
func (r *Runner) ClearCrashLoop(ctx context.Context, name string) error {
	p, err := r.Projection(name)
	units := func() []*Projection { return p.Units() }
	if part, ok := r.parts[name]; ok {
		p, err, units = part, nil, func() []*Projection { return []*Projection{part} }
	}
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.BatchTimeout)
	defer cancel()
	for _, u := range units() {
		if err := r.backend.EndAttempt(ctx, u, nil); err != nil {
			return err
		}
	}
	return nil
}
