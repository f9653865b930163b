package projection

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/name"
)

// ErrPartitionCount matches every *PartitionCountError: a projection registered with one
// partition count (Config.Partitions) and defined with another.
var ErrPartitionCount = errors.New("projection: the partition count changed")

// PartitionCountError reports a projection whose Config.Partitions differs from the count its
// status rows were registered with. Each partition's position covers only its own streams, so
// positions cannot be carried over to another split of the log: a new partition count is a new
// read model. Change it online by raising Config.Version with the new count: the new version
// is built beside the running one, with its own partitions, and cuts over once level (see
// Config.Version). Or, with downtime, delete the projection with the old definition
// (Runner.Delete, which runs its DeleteFunc and removes every partition's row), then Init the
// new definition, which rebuilds the read model from the start of the store. It matches
// ErrPartitionCount.
type PartitionCountError struct {
	// Projection is the projection's unit name.
	Projection string
	// Registered is the count its status rows have; Configured the count of its definition.
	Registered, Configured int
}

func (e *PartitionCountError) Error() string {
	return fmt.Sprintf("projection %s: registered with %d partition(s), defined with %d: a new partition count is a new read model; "+
		"raise Config.Version with it (the new version is built beside this one and cuts over once level), "+
		"or delete the projection with its old definition (Runner.Delete) and start the new one, which rebuilds it",
		e.Projection, e.Registered, e.Configured)
}

// Is makes errors.Is(err, ErrPartitionCount) true.
func (e *PartitionCountError) Is(target error) bool { return target == ErrPartitionCount }

// PartitionUnitName returns the unit name of partition index of a projection split into count
// partitions, whose own unit name is unit (UnitName): "<unit>.p<index>", the index zero-padded
// to the width of count-1 (e.g. "ticket_list.p03" for partition 3 of 16), so the names sort in
// index order. The result is checked with name.Validate.
func PartitionUnitName(unit string, index, count int) (string, error) {
	if err := (eventstore.Partition{Index: index, Count: count}).Validate(); err != nil {
		return "", fmt.Errorf("projection %s: partition unit name: %w", unit, err)
	}
	width := len(strconv.Itoa(count - 1))
	s := fmt.Sprintf("%s.p%0*d", unit, width, index)
	if err := name.Validate(s); err != nil {
		return "", fmt.Errorf("projection %s: partition unit name: %w", unit, err)
	}
	return s, nil
}

// split builds p's partition units, when p has more than one partition.
func (p *Projection) split() error {
	n := p.cfg.Partitions
	if n <= 1 {
		return nil
	}
	p.parts = make([]*Projection, n)
	for k := range n {
		unit, err := PartitionUnitName(p.name, k, n)
		if err != nil {
			return err
		}
		part := *p
		part.name, part.parts, part.parent = unit, nil, p
		part.partition = eventstore.Partition{Index: k, Count: n}
		p.parts[k] = &part
	}
	return nil
}

// Partitions returns how many partitions the projection is split into (Config.Partitions; 1
// when it is not partitioned).
func (p *Projection) Partitions() int { return max(p.cfg.Partitions, 1) }

// Partitioned reports whether the projection definition is split into partitions (more than
// one). Its partitions are units of their own (Units).
func (p *Projection) Partitioned() bool { return len(p.parts) > 0 }

// Units returns the units the projection runs as, each with its own position, status row,
// batch lock and failure: the projection itself when it is not partitioned, else one per
// partition, in index order (named by PartitionUnitName).
func (p *Projection) Units() []*Projection {
	if len(p.parts) == 0 {
		return []*Projection{p}
	}
	return append([]*Projection(nil), p.parts...)
}

// Partition returns the part of the log the unit p reads: one partition for a partition unit
// (see Units), the whole log (the zero Partition) for an unpartitioned projection and for the
// definition of a partitioned one.
func (p *Projection) Partition() eventstore.Partition { return p.partition }

// Definition returns the projection definition a partition unit belongs to; p itself when p is
// not a partition unit.
func (p *Projection) Definition() *Projection {
	if p.parent != nil {
		return p.parent
	}
	return p
}

// unit returns the partition unit of p that holds streamID's events; p itself when p is not
// partitioned.
func (p *Projection) unit(streamID string) *Projection {
	if len(p.parts) == 0 {
		return p
	}
	return p.parts[eventstore.PartitionOf(streamID, len(p.parts))]
}

// Partitions returns the unit names of the projection called name, in index order (see
// PartitionUnitName): one per partition, or the projection's own name when it is not
// partitioned. A worker catches up each with CatchUpPartition (or CatchUp with the unit name).
func (r *Runner) Partitions(name string) ([]string, error) {
	p, err := r.Projection(name)
	if err != nil {
		return nil, err
	}
	units := p.Units()
	out := make([]string, len(units))
	for k, u := range units {
		out[k] = u.name
	}
	return out, nil
}

// CatchUpPartition catches up partition index of the projection called name, as CatchUp does
// for an unpartitioned projection: from the partition's committed position, reading only its
// streams' events, in batches that each hold the partition's lock alone. Partitions of one
// projection may catch up at once, from any goroutines or processes. Index 0 of an
// unpartitioned projection is the projection itself; any other index is an error matching
// ErrInvalidConfig.
//
// WithBatchGuard makes the catch-up ask before each batch whether it may run one (a worker
// asks its partition lease): the catch-up ends, at a committed position, when it may not.
func (r *Runner) CatchUpPartition(ctx context.Context, name string, index int, opts ...CatchUpOption) (Result, error) {
	p, err := r.Projection(name)
	if err != nil {
		return Result{}, err
	}
	units := p.Units()
	if index < 0 || index >= len(units) {
		return Result{}, fmt.Errorf("%w: projection %s has %d partition(s); partition %d does not exist", ErrInvalidConfig, name, len(units), index)
	}
	return r.catchUpUnit(ctx, units[index].name, catchUpGuard(opts))
}

// catchUpGuard returns the batch guard opts set, if any.
func catchUpGuard(opts []CatchUpOption) BatchGuard {
	var o catchUpOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o.guard
}

// CatchUpOption adjusts one CatchUp or CatchUpPartition.
type CatchUpOption func(*catchUpOptions)

type catchUpOptions struct{ guard BatchGuard }

// BatchGuard is asked before each batch of a catch-up whether the batch may run: if ok, the
// batch runs and release is called once it has committed or rolled back; if not, the catch-up
// ends there with Result.Stopped, at the position the last batch committed. A worker passes
// its partition lease (lease.Member.Use), so a partition changes hands only between batches.
type BatchGuard func() (release func(), ok bool)

// WithBatchGuard makes a catch-up ask guard before each batch (see BatchGuard).
func WithBatchGuard(guard BatchGuard) CatchUpOption {
	return func(o *catchUpOptions) { o.guard = guard }
}

// guardedStep runs one batch (step) if guard, when set, lets it; else it marks res Stopped.
func (r *Runner) guardedStep(ctx context.Context, p *Projection, res *Result, guard BatchGuard, limit int) (bool, error) {
	if guard == nil {
		return r.step(ctx, p, res, limit)
	}
	release, ok := guard()
	if !ok {
		res.Stopped = true
		return false, nil
	}
	defer release()
	return r.step(ctx, p, res, limit)
}

// catchUpPartitions catches up every partition of p in turn and sums their results; a
// partition's failure does not stop the next one, but the end of ctx does.
func (r *Runner) catchUpPartitions(ctx context.Context, p *Projection, guard BatchGuard) (Result, error) {
	var (
		sum  Result
		errs []error
	)
	for k, u := range p.parts {
		res, err := r.catchUpUnit(ctx, u.name, guard)
		sum.Events += res.Events
		sum.Batches += res.Batches
		sum.Paused = sum.Paused || res.Paused
		sum.Stopped = sum.Stopped || res.Stopped
		sum.Paced += res.Paced
		sum.Retired = sum.Retired || res.Retired
		if res.Activated {
			sum.Activated, sum.CutOverHeld = true, res.CutOverHeld
		}
		if k == 0 || res.Position.Less(sum.Position) {
			sum.Position = res.Position
		}
		if err != nil {
			if ctx.Err() != nil {
				return sum, err
			}
			errs = append(errs, err)
		}
	}
	return sum, errors.Join(errs...)
}
