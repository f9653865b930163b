package projection

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/name"
)

// RetireGraceDefault is how long a retired version's read model is kept after a newer version
// took over, before its DeleteFunc drops it (Config.RetireGrace).
const RetireGraceDefault = time.Hour

// VersionState is where one version of a projection stands.
type VersionState string

const (
	// VersionActive: the version readers see through the stable names (Config.Tables); it
	// catches up as any projection does.
	VersionActive VersionState = "active"
	// VersionBuilding: a newer version built beside the active one, from the start of the store,
	// as a unit of its own. It handles history (events the active version has already
	// handled) as a replay, and the events after the active version's position live, in
	// batches that claim them (VersionInfo.Claiming), until the cut-over, which brings it to
	// the head and makes it active at once.
	VersionBuilding VersionState = "building"
	// VersionRetired: a version a newer one replaced (or one older than the active version
	// when it was first registered). Its batches do nothing; its DeleteFunc drops its read
	// model after Config.RetireGrace or on Runner.DropRetired.
	VersionRetired VersionState = "retired"
)

// VersionStates lists every version state.
func VersionStates() []VersionState {
	return []VersionState{VersionActive, VersionBuilding, VersionRetired}
}

// UnitName returns the name under which version version of the projection called projection
// keeps its position, status, lock, dead letters, parked streams and trigger subscription: the
// name itself for version 1 (so projections that predate versions keep their rows), else
// "<name>.v<version>" (e.g. "ticket_list.v2"). The result is checked with name.Validate.
func UnitName(projection string, version int) (string, error) {
	if version < 1 {
		return "", &name.Error{Name: projection, Reason: fmt.Sprintf("version %d; versions start at 1", version)}
	}
	unit := projection
	if version > 1 {
		unit = projection + ".v" + strconv.Itoa(version)
	}
	if err := name.Validate(unit); err != nil {
		return "", fmt.Errorf("projection %s version %d: unit name: %w", projection, version, err)
	}
	return unit, nil
}

// TableName returns the table that version version of a projection keeps under the stable name
// stable: "<stable>_v<version>" (e.g. "ticket_list_v2"), unquoted. Projection.Table returns it
// quoted for SQL.
func TableName(stable string, version int) string {
	return stable + "_v" + strconv.Itoa(version)
}

// tablePattern is what a stable table name must look like: a plain, lowercase SQL identifier.
var tablePattern = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// validateTables checks Config.Tables for version: plain identifiers whose versioned names fit
// in PostgreSQL's 63 bytes, no duplicates.
func validateTables(projection string, version int, tables []string) error {
	seen := make(map[string]bool, len(tables))
	for _, t := range tables {
		if !tablePattern.MatchString(t) {
			return invalidConfig(projection, "table %q: use lowercase letters, digits and '_', starting with a letter or '_'", t)
		}
		if n := len(TableName(t, version)); n > name.MaxLength {
			return invalidConfig(projection, "table %q: its versioned name %q is %d bytes; PostgreSQL keeps %d", t, TableName(t, version), n, name.MaxLength)
		}
		if seen[t] {
			return invalidConfig(projection, "table %q is listed twice", t)
		}
		seen[t] = true
	}
	return nil
}

// Version returns the projection's version (Config.Version, 1 when not set).
func (p *Projection) Version() int { return p.cfg.Version }

// Base returns the projection's own name, shared by all its versions: the name New was given.
// Name returns the unit name (UnitName), which is Base for version 1.
func (p *Projection) Base() string { return p.base }

// Tables returns the stable names of the projection's tables (Config.Tables).
func (p *Projection) Tables() []string { return append([]string(nil), p.cfg.Tables...) }

// Table returns the projection's version of the table whose stable name is stable, quoted for
// SQL: p.Table("ticket_list") is `"ticket_list_v2"` for version 2. Handlers and hooks write to
// it; readers query the stable name, a view of the active version's table. The name is
// unqualified, so it resolves on the search path like the view. stable should be one of
// Config.Tables: only those get a view at the cut-over.
func (p *Projection) Table(stable string) string {
	return pgx.Identifier{TableName(stable, p.cfg.Version)}.Sanitize()
}

// replayKey marks a handler's context while it handles history.
type replayKey struct{}

// Replaying reports whether the handler called with ctx handles history: a building version
// handling an event that the active version has already handled (and whose side effects have
// already happened). A handler with side effects outside the read model (an e-mail, a webhook)
// skips them when it is true. It is false for the events a building version handles after
// the active version's position (it claims them in its batches, or handles them in the
// cut-over), and for every event of an active version but those a building version has
// claimed (a stopped active version that resumes handles them as history).
func Replaying(ctx context.Context) bool {
	replay, _ := ctx.Value(replayKey{}).(bool)
	return replay
}

// withReplay marks ctx as handling history.
func withReplay(ctx context.Context) context.Context {
	return context.WithValue(ctx, replayKey{}, true)
}

// VersionInfo is what a backend knows, under the unit's lock, about the version the unit runs.
type VersionInfo struct {
	// State is the version's state; empty for a unit without a version record (treated as
	// active).
	State VersionState
	// ActivePosition is, for a building version, the active version's committed position:
	// the batch handles events up to it only (history). When either version is partitioned,
	// it is the lowest position among the active version's units that can hold streams of
	// the building unit (eventstore.Partition.Overlapping): every event up to it is handled
	// by the active version, whichever unit of it holds the event's stream.
	ActivePosition eventstore.Position
	// ActivePartitions is, when the active version is partitioned, its partitions' committed
	// positions in index order: a cut-over tells history (an event the active version has
	// handled, Replaying) from live events per event, by its stream's active partition.
	ActivePartitions []eventstore.Position
	// Claiming is, for a building version's unit, true when its batch holds the locks of the
	// active version's units that can hold its streams (a busy active version is waited for
	// a bounded time, under a second, then given up): the batch then handles the events after the active
	// version's position too, live, and claims them by committing its position past them (see
	// Claims). ActivePosition and ActivePartitions are read under those locks. Only the one
	// building version of a projection claims; with two building, neither does.
	Claiming bool
	// Claims are, for an active version, the committed positions of the units of each
	// building version (one list per building version, its units in index order), read under
	// the unit's lock: an event after the unit's position and at or before the position of the
	// building unit that holds its stream was claimed — handled live — by that version, and
	// the active version handles it as history (Replaying), so its read model stays complete
	// and the event's side effects are not repeated.
	Claims [][]eventstore.Position
	// RetiredAt is when a retired version was retired; DroppedAt when its read model was
	// dropped (zero while it is kept).
	RetiredAt, DroppedAt time.Time
	// ActiveState and ActiveLag are, for a building version, the active version's state and
	// its lag when the unit started: the age of the oldest readable event of its types it has
	// not handled (zero when it is level with the head). A building version is paced by them
	// (Config.BuildLagTarget).
	ActiveState State
	ActiveLag   time.Duration
	// Undropped is, for an active version, the retired version of the projection retired
	// first whose read model is not dropped yet; zero when there is none.
	Undropped RetiredVersion
}

// activeHandled reports whether the active version has handled e: whether e is history for a
// building version.
func (v VersionInfo) activeHandled(e eventstore.Event) bool {
	at := v.ActivePosition
	if n := len(v.ActivePartitions); n > 0 {
		at = v.ActivePartitions[eventstore.PartitionOf(e.StreamID, n)]
	}
	return !at.Less(e.Position)
}

// claimed reports whether a building version has claimed e (handled it live): whether e,
// read by the active version after its position, is history for it.
func (v VersionInfo) claimed(e eventstore.Event) bool {
	for _, units := range v.Claims {
		if len(units) > 0 && !units[eventstore.PartitionOf(e.StreamID, len(units))].Less(e.Position) {
			return true
		}
	}
	return false
}

// RetiredVersion names a retired version and when it was retired.
type RetiredVersion struct {
	Version   int
	RetiredAt time.Time
}

// Activation is what Backend.Activate did.
type Activation struct {
	// Activated is true when the version is now active.
	Activated bool
	// Reason says why it is not, when it is not.
	Reason string
	// Previous is the version that was active before (0 when none was).
	Previous int
	// Behind is true when it is not active because a unit of the version had more events
	// left to the head than one batch (Config.BatchSize) when the cut-over looked: it catches
	// up first (claiming what the active version has not handled), so the cut-over stays
	// short.
	Behind bool
	// Events counts the events the cut-over handled under the locks.
	Events int
	// Held is how long the cut-over held the active version's lock, from taking it to the
	// commit: the pause the live projection saw.
	Held time.Duration
}
