// Package lease spreads the partitions of a group (a partitioned projection) over the workers
// that run it, with leases in PostgreSQL: each worker is a Member of the group, renews its
// membership and its leases every Config.Renew, and claims or gives back partitions so that
// every live member owns its fair share (Partitions / members, the first members in owner order
// one more). A member that stops renewing (its process died) loses its membership and its
// leases after Config.TTL, and the others claim them when they lapse (each member schedules
// a round for the next lapse of another member's lease): within TTL + Renew of its death.
//
// A partition changes hands only between batches: a member gives back a partition it no longer
// should own once no batch of it is in flight (Use / the release function), so a partition
// moves at a committed position. Leases spread the work; they are not what keeps a read model
// exactly-once: each partition's batches still take its batch lock and advance its position in
// their transaction, so even two members that both believe they own a partition (one stalled
// past its lease) never apply an event twice.
//
// A worker that runs several partitioned projections is a member of several groups: a Set keeps
// them all with one round (a transaction of two to four statements) every Renew instead of a
// round per group, so a worker's lease traffic and its takeover work do not grow with its
// number of groups (fifty groups' separate rounds after a death spread over seconds).
//
// Times are the database's (now()), so the members' clocks need not agree.
package lease

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/postgres"
)

const (
	// TTLDefault is how long a lease and a membership last without renewal: four renewals
	// may fail (or wait) in a row before a live member loses its partitions.
	TTLDefault = 6 * time.Second
	// RenewDefault is how often a member renews. A dead member's partitions are claimed when
	// its leases lapse, TTL after its last renewal (the others schedule a round for that
	// moment): at most TTL after its death plus one round's time. The bound stated is
	// TTL + Renew = 7.5 s after its death, one renewal of slack for a loaded machine.
	RenewDefault = 1500 * time.Millisecond
	// MaxPartitions bounds Config.Partitions.
	MaxPartitions = 1024
)

// ErrInvalidConfig matches the errors of Config.Validate.
var ErrInvalidConfig = errors.New("lease: invalid config")

// ErrClosed is returned by Run after Close.
var ErrClosed = errors.New("lease: member closed")

// Config configures a Member.
type Config struct {
	// Group names what is partitioned, e.g. the projection's name. Required.
	Group string
	// Partitions is how many partitions the group has, 1 to MaxPartitions. Required.
	Partitions int
	// Owner identifies this member among the group's; unique per process. Defaults to the
	// host name, the process id and a random suffix.
	Owner string
	// TTL is how long a lease and the membership last without renewal. Defaults to TTLDefault.
	TTL time.Duration
	// Renew is the interval of renewals, rebalancing and claims; below TTL/2. Defaults to
	// RenewDefault, or TTL/4 when that is shorter.
	Renew time.Duration
	// Schema holds the lease tables ("" for the search_path), as migrated by postgres.Migrate
	// (postgres.ComponentProjections).
	Schema string
	// Logger receives the member's log lines. Defaults to slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns cfg with its zero fields set to their defaults.
func (cfg Config) WithDefaults() Config {
	cfg.TTL = cmp.Or(cfg.TTL, TTLDefault)
	cfg.Renew = cmp.Or(cfg.Renew, min(RenewDefault, cfg.TTL/4))
	if cfg.Owner == "" {
		host, _ := os.Hostname()
		cfg.Owner = fmt.Sprintf("%s-%d-%s", cmp.Or(host, "worker"), os.Getpid(), randomHex(3))
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// Validate reports whether cfg (with defaults applied) is usable; its errors match
// ErrInvalidConfig.
func (cfg Config) Validate() error {
	switch {
	case cfg.Group == "":
		return fmt.Errorf("%w: Group is required", ErrInvalidConfig)
	case cfg.Partitions < 1 || cfg.Partitions > MaxPartitions:
		return fmt.Errorf("%w: Partitions must be 1 to %d, got %d", ErrInvalidConfig, MaxPartitions, cfg.Partitions)
	case cfg.TTL <= 0 || cfg.Renew <= 0 || cfg.Renew*2 > cfg.TTL:
		return fmt.Errorf("%w: need 0 < 2×Renew <= TTL, got Renew %s, TTL %s", ErrInvalidConfig, cfg.Renew, cfg.TTL)
	}
	return postgres.ValidateSchema(cfg.Schema)
}

// Member is one worker's membership in a group. Run (or its Set's Run) keeps it; Use guards a
// batch on a partition.
type Member struct {
	db  postgres.DB
	cfg Config
	sql statements
	log *slog.Logger
	// set runs the member's rounds (New: a set of this member alone).
	set *Set

	mu sync.Mutex
	// parts are the partitions this member holds a lease on.
	parts map[int]*held
	// changed is closed and replaced whenever parts changes.
	changed chan struct{}
	// batchEnded says a batch (Use) ended, for Close.
	batchEnded chan struct{}
	// closed is set by Close: no new batch, no claim, no heartbeat; left once it left.
	closed, left bool
	// seeded is set once the group's lease rows were made (the set's first round).
	seeded bool
}

// held is a partition this member holds.
type held struct {
	inUse int  // batches in flight
	give  bool // to give back once no batch is in flight
}

// New returns a member of cfg.Group; it joins the group at Run's first round. A worker of
// several groups makes their members with NewSet instead.
func New(db postgres.DB, cfg Config) (*Member, error) {
	_, members, err := NewSet(db, cfg)
	if err != nil {
		return nil, err
	}
	return members[0], nil
}

// Owner returns the member's owner id.
func (m *Member) Owner() string { return m.cfg.Owner }

// Owned returns the partitions the member holds, in order (those it is giving back included
// until their last batch ends).
func (m *Member) Owned() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]int, 0, len(m.parts))
	for p := range m.parts {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// Changed returns a channel closed at the next change of Owned.
func (m *Member) Changed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed
}

// Use reports whether the member holds partition p and is not giving it back; if so, it marks
// a batch of p in flight until done is called: the partition is not given back meanwhile.
func (m *Member) Use(p int) (done func(), ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := m.parts[p]
	if h == nil || h.give || m.closed {
		return nil, false
	}
	h.inUse++
	var once sync.Once
	return func() {
		once.Do(func() {
			m.mu.Lock()
			h.inUse--
			give := h.give && h.inUse == 0
			m.mu.Unlock()
			select {
			case m.batchEnded <- struct{}{}: // for Close
			default:
			}
			if give {
				m.poke() // give it back in a round now
			}
		})
	}, true
}

// poke asks the set's Run for a round now.
func (m *Member) poke() { m.set.poke() }

// Run keeps the membership until ctx ends or Close (see Set.Run): it runs the rounds of the
// member's set, which for a member of New is the member alone. Run a Set's members with the
// Set's Run, once.
func (m *Member) Run(ctx context.Context) error { return m.set.Run(ctx) }

// lapseMargin is how long after another member's lease lapses (database time) the round
// that claims it starts: the claim needs the lapse strictly past at the round's start.
const lapseMargin = 5 * time.Millisecond

// nextRound returns how long to wait for the next round after a round that started at start:
// until Renew after start, or until just after lapse (the next lapse of another member's
// lease or membership, zero when none) if that comes first; 0 when either is past.
func nextRound(start time.Time, renew time.Duration, lapse time.Time) time.Duration {
	at := start.Add(renew)
	if !lapse.IsZero() && lapse.Add(lapseMargin).Before(at) {
		at = lapse.Add(lapseMargin)
	}
	return max(0, time.Until(at))
}

// hasLeft reports whether Close has left the group.
func (m *Member) hasLeft() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.left
}

// planGiveBack marks, of the renewed partitions, those over share to give back, highest
// first, and returns those that have no batch in flight (given back now). m.mu is held.
func (m *Member) planGiveBack(renewed []int, share int) []int {
	over := len(renewed) - share
	if over <= 0 {
		for _, p := range renewed {
			if h := m.parts[p]; h != nil {
				h.give = false // the share grew back: keep it
			}
		}
		return nil
	}
	desc := slices.Clone(renewed)
	slices.Sort(desc)
	slices.Reverse(desc)
	var now []int
	for _, p := range desc[:over] {
		h := m.parts[p]
		if h == nil || h.inUse == 0 {
			now = append(now, p)
			continue
		}
		h.give = true
	}
	return now
}

// plan returns the partitions gained and lost by a committed round.
func (m *Member) plan(renewed, given, claimed []int) (gained, lost []int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for p := range m.parts {
		if !slices.Contains(renewed, p) || slices.Contains(given, p) {
			lost = append(lost, p)
		}
	}
	for _, p := range claimed {
		if m.parts[p] == nil {
			gained = append(gained, p)
		}
	}
	for _, p := range renewed {
		if m.parts[p] == nil && !slices.Contains(given, p) {
			gained = append(gained, p) // held in the table but not known here (a restart)
		}
	}
	slices.Sort(gained)
	slices.Sort(lost)
	return gained, lost
}

// apply records a committed round's changes and signals them.
func (m *Member) apply(gained, lost []int) {
	if len(gained) == 0 && len(lost) == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range lost {
		delete(m.parts, p)
	}
	for _, p := range gained {
		m.parts[p] = &held{}
	}
	close(m.changed)
	m.changed = make(chan struct{})
}

// Close leaves the group: it waits for the batches in flight (Use) to end or ctx to end,
// then gives back every lease and removes the membership, so the others claim the partitions
// at their next round instead of after TTL. Run returns ErrClosed.
func (m *Member) Close(ctx context.Context) error {
	m.mu.Lock()
	m.closed = true
	for _, h := range m.parts {
		h.give = true
	}
	m.mu.Unlock()
	m.poke()
	for {
		m.mu.Lock()
		busy := 0
		for _, h := range m.parts {
			busy += h.inUse
		}
		m.mu.Unlock()
		if busy == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("lease: close: %d batches still in flight: %w", busy, ctx.Err())
		case <-m.batchEnded:
		}
	}
	if err := m.leave(ctx); err != nil {
		return err
	}
	m.apply(nil, m.Owned())
	m.poke() // Run returns ErrClosed
	return nil
}

// leave removes the membership and gives every lease back, between two rounds of the set: a
// round in flight may still have renewed the membership or be about to claim for it.
func (m *Member) leave(ctx context.Context) error {
	if !m.set.rounding.TryLock() {
		if m.set.leaveWaits != nil {
			m.set.leaveWaits()
		}
		m.set.rounding.Lock()
	}
	defer m.set.rounding.Unlock()
	if _, err := m.db.Exec(ctx, m.sql.leave, m.cfg.Group, m.cfg.Owner); err != nil {
		return fmt.Errorf("lease: leave: %w", err)
	}
	m.mu.Lock()
	m.left = true
	m.mu.Unlock()
	return nil
}

// fairShare is how many of partitions a member of rank (0-based, in owner order) among
// members should own.
func fairShare(partitions, members, rank int) int {
	if members <= 0 {
		return partitions
	}
	share := partitions / members
	if rank < partitions%members {
		share++
	}
	return share
}

// Lease is one partition's lease, as Leases reports it.
type Lease struct {
	Partition int
	// Owner is "" for a partition no live member holds.
	Owner      string
	ExpiresAt  time.Time
	AcquiredAt time.Time
}

// Leases returns the leases of group's partitions 0 to partitions-1, in order; a partition
// without a live lease has no Owner.
func Leases(ctx context.Context, db postgres.DB, schema, group string, partitions int) ([]Lease, error) {
	if err := postgres.ValidateSchema(schema); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, newStatements(schema).list, group, partitions)
	if err != nil {
		return nil, fmt.Errorf("lease: list: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Lease, error) {
		var (
			l         Lease
			owner     *string
			exp, acqd *time.Time
		)
		err := row.Scan(&l.Partition, &owner, &exp, &acqd)
		if owner != nil {
			l.Owner, l.ExpiresAt, l.AcquiredAt = *owner, *exp, *acqd
		}
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("lease: list: %w", err)
	}
	return out, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
