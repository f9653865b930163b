package memory

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection"
)

// version is the record of one version of a projection.
type version struct {
	unit                 string
	state                projection.VersionState
	retiredAt, droppedAt time.Time
}

// registerVersion records p's version and returns its state: the first version registered is
// active, a higher one than the active builds beside it, a lower one is retired. A projection
// registered before (its version 1 row exists without a record) is version 1, active. The
// caller holds b.mu.
func (b *Backend) registerVersion(p *projection.Projection) projection.VersionState {
	vs := b.versions[p.Base()]
	if vs == nil {
		vs = make(map[int]*version)
		b.versions[p.Base()] = vs
		if _, ok := b.rows[p.Base()]; ok && p.Version() > 1 {
			vs[1] = &version{unit: p.Base(), state: projection.VersionActive}
		}
	}
	if v, ok := vs[p.Version()]; ok {
		return v.state
	}
	v := &version{unit: p.Name(), state: projection.VersionActive}
	if active := activeOf(vs); active > 0 {
		v.state = projection.VersionBuilding
		if p.Version() < active {
			v.state, v.retiredAt = projection.VersionRetired, b.now()
		}
	}
	vs[p.Version()] = v
	return v.state
}

// activeOf returns the active version among vs, 0 when none is.
func activeOf(vs map[int]*version) int {
	for n, v := range vs {
		if v.state == projection.VersionActive {
			return n
		}
	}
	return 0
}

// versionOf returns the record of the unit called unit, its projection's records and its
// version; nil when it has none. The caller holds b.mu.
func (b *Backend) versionOf(unit string) (*version, map[int]*version) {
	for _, vs := range b.versions {
		for _, v := range vs {
			if v.unit == unit {
				return v, vs
			}
		}
	}
	return nil, nil
}

// versionInfo returns the version record of p's unit as a batch sees it. For a building
// version, the active version's position is the lowest among its units that can hold streams
// of p (eventstore.Partition.Overlapping), and its lag the age of the first event of p's types
// after it (this backend does not keep the active version's types).
func (b *Backend) versionInfo(ctx context.Context, p *projection.Projection) (projection.VersionInfo, error) {
	b.mu.Lock()
	v, vs := b.versionOf(p.Definition().Name())
	if v == nil {
		b.mu.Unlock()
		return projection.VersionInfo{}, nil
	}
	info := projection.VersionInfo{State: v.state, RetiredAt: v.retiredAt, DroppedAt: v.droppedAt}
	var active []*row
	if v.state == projection.VersionActive {
		info.Undropped = undropped(vs)
		info.Claims = b.claims(vs)
	}
	if a := vs[activeOf(vs)]; a != nil && v.state == projection.VersionBuilding {
		active = b.activeRows(a.unit, p.Partition())
	}
	b.mu.Unlock()
	if len(active) == 0 {
		return info, nil
	}
	st := active[0].get()
	for _, r := range active[1:] {
		if at := r.get(); at.Position.Less(st.Position) {
			st = at
		}
	}
	info.ActivePosition, info.ActiveState = st.Position, st.State
	next, err := b.store.Read(ctx, st.Position, eventstore.ReadOptions{Limit: 1, Types: p.Types()})
	if err != nil {
		return info, err
	}
	if len(next) > 0 {
		info.ActiveLag = max(b.now().Sub(next[0].RecordedAt), 0)
	}
	return info, nil
}

// activeRows returns the rows of the units of unit, the active version's unit name, that can
// hold streams of part: unit's own row, or those of its partitions that overlap part. The
// caller holds b.mu.
func (b *Backend) activeRows(unit string, part eventstore.Partition) []*row {
	count := b.parts[unit]
	if count == 0 {
		if r := b.rows[unit]; r != nil {
			return []*row{r}
		}
		return nil
	}
	var out []*row
	for _, k := range part.Overlapping(count) {
		if r := b.rows[partitionName(unit, k, count)]; r != nil {
			out = append(out, r)
		}
	}
	return out
}

// partitionName is projection.PartitionUnitName of a partition registered before (so valid).
func partitionName(unit string, index, count int) string {
	name, _ := projection.PartitionUnitName(unit, index, count)
	return name
}

// unitsOf returns the names of the units of unit, a version's unit name: itself, then its
// partitions when it is a partitioned projection's definition. The caller holds b.mu.
func (b *Backend) unitsOf(unit string) []string {
	names := []string{unit}
	for k := range b.parts[unit] {
		names = append(names, partitionName(unit, k, b.parts[unit]))
	}
	return names
}

// undropped returns the retired version among vs retired first whose read model is not
// dropped; zero when none is.
func undropped(vs map[int]*version) projection.RetiredVersion {
	var old projection.RetiredVersion
	for n, v := range vs {
		if v.state != projection.VersionRetired || !v.droppedAt.IsZero() {
			continue
		}
		if old.Version == 0 || v.retiredAt.Before(old.RetiredAt) || (v.retiredAt.Equal(old.RetiredAt) && n < old.Version) {
			old = projection.RetiredVersion{Version: n, RetiredAt: v.retiredAt}
		}
	}
	return old
}

// versionStatus fills st's version fields for p.
func (b *Backend) versionStatus(p *projection.Projection, st *projection.Status) {
	b.mu.Lock()
	defer b.mu.Unlock()
	st.Version = p.Version()
	if v, vs := b.versionOf(p.Definition().Name()); v != nil {
		st.VersionState, st.ActiveVersion, st.RetiredAt = v.state, activeOf(vs), v.retiredAt
	}
}

// lockedUnits runs fn holding the locks of units, in order, skipping repeats and units
// without a row.
func (b *Backend) lockedUnits(ctx context.Context, units []string, fn func() error) error {
	if len(units) == 0 {
		return fn()
	}
	b.mu.Lock()
	_, ok := b.rows[units[0]]
	b.mu.Unlock()
	if !ok || (len(units) > 1 && units[0] == units[1]) {
		return b.lockedUnits(ctx, units[1:], fn)
	}
	return b.locked(ctx, units[0], func(*row) error { return b.lockedUnits(ctx, units[1:], fn) })
}

// Activate implements projection.Backend, holding the locks of the projection's version 1,
// the active version's units and p's. Without a transaction, a failing Run or hook leaves
// everything as it was only because the outcomes are applied last: the handlers' side effects
// stay.
func (b *Backend) Activate(ctx context.Context, p *projection.Projection, co projection.CutOver, hook projection.HookFunc) (projection.Activation, error) {
	b.mu.Lock()
	units := []string{p.Base()}
	var activeUnit string
	vs := b.versions[p.Base()]
	if a := vs[activeOf(vs)]; a != nil {
		activeUnit = a.unit
		units = append(units, b.unitsOf(a.unit)...)
	}
	units = append(units, b.unitsOf(p.Name())...)
	b.mu.Unlock()
	var act projection.Activation
	err := b.lockedUnits(ctx, units, func() error {
		rows, err := b.rowsOf(p)
		if err != nil {
			return err
		}
		start := time.Now()
		cus, reason, err := b.cutoverUnits(ctx, p, rows, activeUnit)
		if err != nil || reason != "" {
			act.Reason = reason
			return err
		}
		if behind, err := b.behind(ctx, co, cus); err != nil || behind != "" {
			act.Reason, act.Behind = behind, behind != ""
			return err
		}
		outs := make([]projection.Outcome, len(cus))
		events := 0
		for k, cu := range cus {
			if outs[k], err = co.Run(ctx, cu.p, b.unit(cu.r, cu.ver)); err != nil {
				return err
			}
			events += outs[k].Processed
		}
		if err := runHook(ctx, hook); err != nil {
			return err
		}
		for k, cu := range cus {
			b.apply(cu.r, outs[k])
		}
		act = b.flip(p, events)
		act.Held = time.Since(start)
		return nil
	})
	return act, err
}

// behind asks every unit of the cut-over whether it is behind (co.Behind) and says which is;
// empty when none is.
func (b *Backend) behind(ctx context.Context, co projection.CutOver, cus []cutoverUnit) (string, error) {
	for _, cu := range cus {
		behind, err := co.Behind(ctx, cu.p, b.unit(cu.r, cu.ver))
		if err != nil {
			return "", err
		}
		if behind {
			return fmt.Sprintf("%s (version %d) has more than a batch of events left to the head", cu.p.Name(), cu.p.Version()), nil
		}
	}
	return "", nil
}

// cutoverUnit is a unit of the building version as the cut-over found it.
type cutoverUnit struct {
	p   *projection.Projection
	r   *row
	ver projection.VersionInfo
}

// cutoverUnits returns p's units, whose rows are rows, with their version records, or says
// why p may not cut over. The caller holds the locks of Activate.
func (b *Backend) cutoverUnits(ctx context.Context, p *projection.Projection, rows []*row, activeUnit string) ([]cutoverUnit, string, error) {
	var activeParts []eventstore.Position
	b.mu.Lock()
	if count := b.parts[activeUnit]; count > 0 {
		for _, r := range b.activeRows(activeUnit, eventstore.Partition{}) {
			activeParts = append(activeParts, r.get().Position)
		}
	}
	b.mu.Unlock()
	out := make([]cutoverUnit, 0, len(rows))
	for k, u := range p.Units() {
		if reason := b.notReady(u, rows[k]); reason != "" {
			return nil, reason, nil
		}
		ver, err := b.versionInfo(ctx, u)
		if err != nil {
			return nil, "", err
		}
		ver.ActivePartitions = activeParts
		out = append(out, cutoverUnit{p: u, r: rows[k], ver: ver})
	}
	return out, "", nil
}

// notReady says why u, a unit of a building version whose row is r, may not cut over; empty
// when it may.
func (b *Backend) notReady(u *projection.Projection, r *row) string {
	b.mu.Lock()
	v := b.versions[u.Base()][u.Version()]
	b.mu.Unlock()
	st := r.get()
	switch {
	case v == nil || v.state != projection.VersionBuilding:
		return fmt.Sprintf("version %d is not building", u.Version())
	case st.State != projection.StateRunning && st.State != projection.StateFailing:
		return fmt.Sprintf("%s (version %d) is %s", u.Name(), u.Version(), st.State)
	case len(r.parkedCopy()) > 0:
		return fmt.Sprintf("%s (version %d) has parked streams", u.Name(), u.Version())
	}
	return ""
}

// flip retires the active version of p's projection and makes p's active.
func (b *Backend) flip(p *projection.Projection, events int) projection.Activation {
	b.mu.Lock()
	defer b.mu.Unlock()
	vs := b.versions[p.Base()]
	act := projection.Activation{Activated: true, Events: events, Previous: activeOf(vs)}
	if a := vs[act.Previous]; a != nil {
		a.state, a.retiredAt = projection.VersionRetired, b.now()
	}
	vs[p.Version()].state = projection.VersionActive
	return act
}

// DropRetired implements projection.Backend.
func (b *Backend) DropRetired(ctx context.Context, p *projection.Projection, hook projection.HookFunc) error {
	return b.lockedAll(ctx, p, func([]*row) error {
		b.mu.Lock()
		v := b.versions[p.Base()][p.Version()]
		b.mu.Unlock()
		switch {
		case v == nil || v.state != projection.VersionRetired:
			return fmt.Errorf("projection %s version %d is not retired: %w", p.Name(), p.Version(), projection.ErrNotRetired)
		case !v.droppedAt.IsZero():
			return nil
		}
		if err := runHook(ctx, hook); err != nil {
			return err
		}
		b.mu.Lock()
		v.droppedAt = b.now()
		b.mu.Unlock()
		return nil
	})
}

// DropRetiredTables implements projection.Backend. The memory backend keeps no read model: it
// records the drop.
func (b *Backend) DropRetiredTables(ctx context.Context, p *projection.Projection, version int) error {
	b.mu.Lock()
	v := b.versions[p.Base()][version]
	b.mu.Unlock()
	if v == nil {
		return fmt.Errorf("projection %s version %d is not retired: %w", p.Base(), version, projection.ErrNotRetired)
	}
	b.mu.Lock()
	units := b.unitsOf(v.unit)
	b.mu.Unlock()
	return b.lockedUnits(ctx, units, func() error {
		b.mu.Lock()
		defer b.mu.Unlock()
		switch {
		case v.state != projection.VersionRetired:
			return fmt.Errorf("projection %s version %d is not retired: %w", p.Base(), version, projection.ErrNotRetired)
		case v.droppedAt.IsZero():
			v.droppedAt = b.now()
		}
		return nil
	})
}

// claims returns the committed positions of the units of every building version among vs, by
// version, in index order (projection.VersionInfo.Claims). The caller holds b.mu.
func (b *Backend) claims(vs map[int]*version) [][]eventstore.Position {
	var out [][]eventstore.Position
	for _, n := range slices.Sorted(maps.Keys(vs)) {
		if vs[n].state != projection.VersionBuilding {
			continue
		}
		var positions []eventstore.Position
		for _, name := range b.unitRows(vs[n].unit) {
			positions = append(positions, b.rows[name].get().Position)
		}
		if len(positions) > 0 {
			out = append(out, positions)
		}
	}
	return out
}

// unitRows returns the names of the units of unit, a version's unit name, that have a status
// row: itself, or its partitions in index order. The caller holds b.mu.
func (b *Backend) unitRows(unit string) []string {
	names := b.unitsOf(unit)
	if len(names) > 1 {
		names = names[1:] // a partitioned projection's definition keeps no position
	}
	var out []string
	for _, name := range names {
		if _, ok := b.rows[name]; ok {
			out = append(out, name)
		}
	}
	return out
}

// claimWait bounds how long a building version's claim waits for each lock of the active
// version (as the PostgreSQL backend's does): a busy active version runs its batches back to
// back, and a claim that only tried its lock seldom got in between two of them.
const claimWait = 500 * time.Millisecond

// claim lets the batch of p, a building version's unit whose read reaches past the active
// version's position, claim the events after it (projection.VersionInfo.Claiming): when p's version is the only
// building one and it takes the locks of the active version's units that can hold p's
// streams, waiting up to claimWait for each, it reads the active version's positions anew and
// returns the function that releases them (nil when it claims nothing: a wait that timed out
// releases what it took).
func (b *Backend) claim(ctx context.Context, p *projection.Projection, ver *projection.VersionInfo) func() {
	if ver.State != projection.VersionBuilding || ver.Claiming {
		return nil
	}
	rows, active := b.claimable(p)
	if len(active) == 0 {
		return nil
	}
	var taken []*row
	release := func() {
		for _, r := range taken {
			<-r.lock
		}
	}
	for _, r := range active {
		wait := time.NewTimer(claimWait)
		select {
		case r.lock <- struct{}{}:
			wait.Stop()
			taken = append(taken, r)
		case <-wait.C:
			release()
			return nil
		case <-ctx.Done():
			wait.Stop()
			release()
			return nil
		}
	}
	ver.Claiming, ver.ActivePartitions = true, nil
	ver.ActivePosition = active[0].get().Position
	for _, r := range active[1:] {
		if at := r.get().Position; at.Less(ver.ActivePosition) {
			ver.ActivePosition = at
		}
	}
	if len(rows) > 1 {
		for _, r := range rows {
			ver.ActivePartitions = append(ver.ActivePartitions, r.get().Position)
		}
	}
	return release
}

// claimable returns the rows of the active version's units (all, in index order) and of those
// that can hold p's streams, when p's version is its projection's only building one; nothing
// otherwise.
func (b *Backend) claimable(p *projection.Projection) (all, active []*row) {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, vs := b.versionOf(p.Definition().Name())
	building := 0
	for _, v := range vs {
		if v.state == projection.VersionBuilding {
			building++
		}
	}
	a := vs[activeOf(vs)]
	if building != 1 || a == nil {
		return nil, nil
	}
	for _, name := range b.unitRows(a.unit) {
		all = append(all, b.rows[name])
	}
	return all, b.activeRows(a.unit, p.Partition())
}
