// Package chaosmodel defines the read models of the fault-injection suite (internal/chaos): the
// event its writers append and three projections of it that the worker processes run and the
// suite verifies against the event store afterwards. Every model keeps, per event, its stream,
// stream version and payload fields (writer, seq) and the order of its first application (a
// sequence in the tables, the time in the file), so the suite compares content and per-stream
// order, not only event ids.
//
//   - ExactProjection (projection.On): a table in the event store's database keyed by event
//     id, with a counter that every handling increments inside the batch's transaction, so a
//     duplicate shows as a counter above 1. It is exactly-once: no duplicate is allowed.
//     A payload marked Poison fails it until the control table holds PoisonFixedKey. With
//     Config.ExactVersion it is a versioned projection: each version writes a table of its
//     own (ExactTable) and the name ExactProjection is a view of the active version's.
//   - IdempotentProjection (projection.OnIdempotent): an upsert through the pool, outside the
//     batch's transaction, counting deliveries. At-least-once: duplicates are allowed.
//   - FileProjection (projection.OnIdempotent): appends a line per event to a file of the
//     process's own. At-least-once: duplicates are allowed, missing lines are not.
package chaosmodel

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nudgeworks/nudge/projection"
)

// Names of the event type, projections and tables.
const (
	// EventType is the type of every event the suite appends.
	EventType = "ChaosAppended"
	// ExactProjection is the exactly-once projection; its table has the same name.
	ExactProjection = "chaos_exact"
	// IdempotentProjection is the at-least-once projection writing through the pool; its
	// table has the same name.
	IdempotentProjection = "chaos_idem"
	// FileProjection is the at-least-once projection appending to a file.
	FileProjection = "chaos_file"
	// ControlTable holds switches the handlers read (key text primary key).
	ControlTable = "chaos_control"
	// PoisonFixedKey in ControlTable is the "fix" that lets ExactProjection handle a Poison
	// event.
	PoisonFixedKey = "poison_fixed"
)

// Names lists the three projections, sorted.
func Names() []string { return []string{ExactProjection, FileProjection, IdempotentProjection} }

// Payload is the payload of an EventType event.
type Payload struct {
	// Writer and Seq say which writer appended the event and its sequence number there.
	Writer int `json:"w"`
	Seq    int `json:"n"`
	// Poison makes ExactProjection fail on the event until the fix is in ControlTable.
	Poison bool `json:"poison,omitempty"`
}

// ErrPoison is the failure of ExactProjection on a Poison event before the fix.
var ErrPoison = errors.New("chaosmodel: poison event (insert " + PoisonFixedKey + " into " + ControlTable + " to fix)")

// DB is what the idempotent projection writes through; *pgxpool.Pool satisfies it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Config configures the projections of one process.
type Config struct {
	// DB receives IdempotentProjection's upserts. Required.
	DB DB
	// SinkPath is the file FileProjection appends to; created if missing. Required. Give every
	// process a file of its own: lines of concurrent processes never interleave then, and a
	// process killed mid-write can only leave a torn last line in its own file.
	SinkPath string
	// BatchSize of every projection. Defaults to 100: small batches put more batch boundaries
	// (and so more kill points) into a run.
	BatchSize int
	// ParkAfter, when positive, makes ExactProjection park a failing event's stream
	// (projection.OnFailurePark) after that many recorded failures, instead of stopping.
	ParkAfter int
	// ExactVersion, when positive, makes ExactProjection a versioned projection at that
	// version (projection.Config.Version): its table is ExactTable(ExactVersion), read through
	// the view ExactProjection. 0 keeps the plain table ExactProjection of an unversioned
	// projection.
	ExactVersion int
	// BuildLagTarget is ExactProjection's projection.Config.BuildLagTarget (0: the library's
	// default; negative: unpaced).
	BuildLagTarget time.Duration
	// ActivateFunc, if set, runs in ExactProjection's cut-over (projection.Config.ActivateFunc).
	ActivateFunc func(ctx context.Context) error
	// Partitions, when above 1, splits ExactProjection into that many partitions by stream
	// (projection.Config.Partitions): each partition is a unit of its own (ExactProjection.pNN)
	// with its own position, and the workers spread them with leases. With ExactVersion it is
	// that version's count (a new version may change it: chaos_exact.v2.p5 is partition 5 of
	// version 2). The other projections stay unpartitioned.
	Partitions int
	// Fleet, when positive, adds that many more exactly-once projections (FleetProjection),
	// each like ExactProjection (unversioned) with a table of its own named as it is: the
	// scale-fleet scenario's many projections.
	Fleet int
	// FleetPartitioned is how many of the fleet projections, from the first, are split into
	// Partitions as ExactProjection is; the others are unpartitioned. Negative: all of them.
	FleetPartitioned int
}

// FleetProjection is the name (and table) of the i-th fleet projection (Config.Fleet), from 1.
func FleetProjection(i int) string { return fmt.Sprintf("chaos_fleet_%02d", i) }

// IsExactlyOnce reports whether the named projection is exactly-once: ExactProjection or a
// fleet projection.
func IsExactlyOnce(name string) bool {
	return name == ExactProjection || strings.HasPrefix(name, "chaos_fleet_")
}

// ExactTable is the table of ExactProjection's version version: "chaos_exact_v<version>".
func ExactTable(version int) string { return projection.TableName(ExactProjection, version) }

// ExactUnit is the unit name of ExactProjection's version version (projection.UnitName):
// its queue, position and status are under this name.
func ExactUnit(version int) string {
	unit, err := projection.UnitName(ExactProjection, version)
	if err != nil {
		panic(err) // the name is a constant, and valid for every version from 1
	}
	return unit
}

// Models are the three projections of one process and the file behind FileProjection.
type Models struct {
	// Projections are ExactProjection, IdempotentProjection and FileProjection.
	Projections []*projection.Projection

	mu   sync.Mutex
	sink *os.File
}

// New defines the projections. Close the Models when done.
func New(cfg Config) (*Models, error) {
	if cfg.DB == nil || cfg.SinkPath == "" {
		return nil, errors.New("chaosmodel: Config.DB and Config.SinkPath are required")
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = 100
	}
	sink, err := os.OpenFile(cfg.SinkPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("chaosmodel: open the file sink: %w", err)
	}
	m := &Models{sink: sink}
	onFailure := projection.OnFailureStop
	if cfg.ParkAfter > 0 {
		onFailure = projection.OnFailurePark
	}
	exact, err := m.exact(cfg, onFailure)
	if err != nil {
		return nil, errors.Join(err, sink.Close())
	}
	idem, err := projection.New(IdempotentProjection, projection.Config{
		BatchSize: cfg.BatchSize,
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+IdempotentProjection+` (
				event_id   uuid PRIMARY KEY,
				deliveries integer NOT NULL,
				first_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
				stream_id  text NOT NULL,
				version    bigint NOT NULL,
				writer     integer NOT NULL,
				seq        integer NOT NULL,
				applied    bigserial NOT NULL)`)
			return err
		},
	}, projection.OnIdempotent(EventType, func(ctx context.Context, e projection.Event[Payload]) error {
		_, err := cfg.DB.Exec(ctx, `INSERT INTO `+IdempotentProjection+` (event_id, deliveries, stream_id, version, writer, seq) VALUES ($1, 1, $2, $3, $4, $5)
			ON CONFLICT (event_id) DO UPDATE SET deliveries = `+IdempotentProjection+`.deliveries + 1`, e.ID, e.StreamID, e.StreamVersion, e.Data.Writer, e.Data.Seq)
		return err
	}))
	if err != nil {
		return nil, errors.Join(err, sink.Close())
	}
	file, err := projection.New(FileProjection, projection.Config{BatchSize: cfg.BatchSize},
		projection.OnIdempotent(EventType, func(_ context.Context, e projection.Event[Payload]) error {
			return m.writeLine(Line{ID: e.ID, At: time.Now(), Stream: e.StreamID, Version: e.StreamVersion, Writer: e.Data.Writer, Seq: e.Data.Seq})
		}))
	if err != nil {
		return nil, errors.Join(err, sink.Close())
	}
	m.Projections = []*projection.Projection{exact, idem, file}
	for i := 1; i <= cfg.Fleet; i++ {
		partitions := cfg.Partitions
		if cfg.FleetPartitioned >= 0 && i > cfg.FleetPartitioned {
			partitions = 0
		}
		p, err := fleet(cfg, FleetProjection(i), partitions)
		if err != nil {
			return nil, errors.Join(err, sink.Close())
		}
		m.Projections = append(m.Projections, p)
	}
	return m, nil
}

// exact defines ExactProjection: unversioned with its plain table, or at cfg.ExactVersion with
// its version's table behind the view.
func (m *Models) exact(cfg Config, onFailure projection.OnFailure) (*projection.Projection, error) {
	table := ExactProjection
	pc := projection.Config{BatchSize: cfg.BatchSize, OnFailure: onFailure, ParkAfterAttempts: cfg.ParkAfter, Partitions: cfg.Partitions}
	if cfg.ExactVersion > 0 {
		table = ExactTable(cfg.ExactVersion)
		pc.Version, pc.Tables, pc.BuildLagTarget = cfg.ExactVersion, []string{ExactProjection}, cfg.BuildLagTarget
	}
	if cfg.ActivateFunc != nil {
		pc.ActivateFunc = func(ctx context.Context, _ projection.HookParams) error { return cfg.ActivateFunc(ctx) }
	}
	pc.InitFunc = func(ctx context.Context, p projection.HookParams) error {
		_, err := p.Tx.Exec(ctx, exactTableSQL(table)+`;
			CREATE TABLE IF NOT EXISTS `+ControlTable+` (key text PRIMARY KEY)`)
		return err
	}
	return projection.New(ExactProjection, pc, projection.On(EventType, func(ctx context.Context, tx pgx.Tx, e projection.Event[Payload]) error {
		if e.Data.Poison {
			var fixed bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+ControlTable+` WHERE key = $1)`, PoisonFixedKey).Scan(&fixed); err != nil {
				return err
			}
			if !fixed {
				return ErrPoison
			}
		}
		return recordExact(ctx, tx, table, e)
	}))
}

// exactTableSQL creates an exactly-once read model's table: one row per event, counting how
// many times it was applied.
func exactTableSQL(table string) string {
	return `CREATE TABLE IF NOT EXISTS ` + table + ` (
		event_id     uuid PRIMARY KEY,
		times        integer NOT NULL,
		projected_at timestamptz NOT NULL DEFAULT clock_timestamp(),
		stream_id    text NOT NULL,
		version      bigint NOT NULL,
		writer       integer NOT NULL,
		seq          integer NOT NULL,
		applied      bigserial NOT NULL)`
}

// recordExact records e in the exactly-once read model table, counting a second application.
func recordExact(ctx context.Context, tx pgx.Tx, table string, e projection.Event[Payload]) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_id, times, stream_id, version, writer, seq) VALUES ($1, 1, $2, $3, $4, $5)
		ON CONFLICT (event_id) DO UPDATE SET times = `+table+`.times + 1`, e.ID, e.StreamID, e.StreamVersion, e.Data.Writer, e.Data.Seq)
	return err
}

// fleet defines one fleet projection: ExactProjection's table and handler under another name,
// split into partitions (0 or 1: unpartitioned).
func fleet(cfg Config, table string, partitions int) (*projection.Projection, error) {
	pc := projection.Config{BatchSize: cfg.BatchSize, Partitions: partitions}
	pc.InitFunc = func(ctx context.Context, p projection.HookParams) error {
		_, err := p.Tx.Exec(ctx, exactTableSQL(table))
		return err
	}
	return projection.New(table, pc, projection.On(EventType, func(ctx context.Context, tx pgx.Tx, e projection.Event[Payload]) error {
		return recordExact(ctx, tx, table, e)
	}))
}

// Line is one line of FileProjection's sink: an event's id, when it was applied, its stream,
// version and payload fields.
type Line struct {
	ID      uuid.UUID
	At      time.Time
	Stream  string
	Version int64
	Writer  int
	Seq     int
}

// AppendText appends "<id> <unix nanoseconds> <stream> <version> <writer> <seq>\n" to b.
func (l Line) AppendText(b []byte) []byte {
	b = append(b, l.ID.String()...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, l.At.UnixNano(), 10)
	b = append(b, ' ')
	b = append(b, l.Stream...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, l.Version, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(l.Writer), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(l.Seq), 10)
	return append(b, '\n')
}

// ParseLine reads a line written by AppendText, newline included; false if it is torn or
// malformed.
func ParseLine(text []byte) (Line, bool) {
	if len(text) == 0 || text[len(text)-1] != '\n' {
		return Line{}, false
	}
	f := strings.Fields(string(text[:len(text)-1]))
	if len(f) != 6 {
		return Line{}, false
	}
	id, err := uuid.Parse(f[0])
	nanos, err2 := strconv.ParseInt(f[1], 10, 64)
	version, err3 := strconv.ParseInt(f[3], 10, 64)
	writer, err4 := strconv.Atoi(f[4])
	seq, err5 := strconv.Atoi(f[5])
	if errors.Join(err, err2, err3, err4, err5) != nil {
		return Line{}, false
	}
	return Line{ID: id, At: time.Unix(0, nanos), Stream: f[2], Version: version, Writer: writer, Seq: seq}, true
}

// writeLine appends the line to the sink in one write.
func (m *Models) writeLine(l Line) error {
	line := l.AppendText(make([]byte, 0, 96))
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.sink.Write(line); err != nil {
		return fmt.Errorf("chaosmodel: write to the file sink: %w", err)
	}
	return nil
}

// Close closes the file sink.
func (m *Models) Close() error { return m.sink.Close() }
