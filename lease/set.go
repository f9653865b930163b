package lease

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/postgres"
)

// Set is one owner's memberships in several groups, kept together: each round renews every
// membership and lease, gives back and claims partitions in all the groups in one transaction
// of two to four statements, whatever the number of groups. Make it with NewSet; run it with
// Run, once.
type Set struct {
	db      postgres.DB
	members []*Member
	// owner, ttl, every (Renew) and sql are the members' (they share them).
	owner      string
	ttl, every time.Duration
	sql        statements
	// wake asks Run for a round now.
	wake chan struct{}
	// rounding is held through a round and through a member's leaving (Close), so a round
	// never claims for a member that has left its group, nor renews its membership again.
	rounding sync.Mutex
	// newTimer returns a channel that receives after d and its stop function (a time.Timer's);
	// tests replace it to fire Run's rounds themselves.
	newTimer func(d time.Duration) (<-chan time.Time, func() bool)
	// beforeClaim, when set (by tests), is called in a round's transaction after its renewals.
	beforeClaim func()
	// leaveWaits, when set (by tests), is called by a leaving member that finds a round in
	// flight, before it waits for the round to end.
	leaveWaits func()
}

// newTimer is Set.newTimer's default: a time.Timer.
func newTimer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

// NewSet returns a set of members, one per config and in their order, that join their groups
// at Run's first round. The configs name different groups and share Owner, TTL, Renew and
// Schema once their defaults are set (a config without an Owner takes the first's); each
// member logs to its config's Logger. Errors match ErrInvalidConfig.
func NewSet(db postgres.DB, cfgs ...Config) (*Set, []*Member, error) {
	if db == nil {
		return nil, nil, fmt.Errorf("%w: a database handle is required", ErrInvalidConfig)
	}
	if len(cfgs) == 0 {
		return nil, nil, fmt.Errorf("%w: a set needs at least one group", ErrInvalidConfig)
	}
	first := cfgs[0].WithDefaults()
	s := &Set{db: db, owner: first.Owner, ttl: first.TTL, every: first.Renew, sql: newStatements(first.Schema),
		wake: make(chan struct{}, 1), newTimer: newTimer}
	groups := map[string]bool{}
	for _, cfg := range cfgs {
		cfg.Owner = cmp.Or(cfg.Owner, first.Owner)
		cfg = cfg.WithDefaults()
		if err := cfg.Validate(); err != nil {
			return nil, nil, err
		}
		if cfg.Owner != first.Owner || cfg.TTL != first.TTL || cfg.Renew != s.every || cfg.Schema != first.Schema {
			return nil, nil, fmt.Errorf("%w: the members of a set share Owner, TTL, Renew and Schema; %q differs from %q", ErrInvalidConfig, cfg.Group, first.Group)
		}
		if groups[cfg.Group] {
			return nil, nil, fmt.Errorf("%w: group %q twice in a set", ErrInvalidConfig, cfg.Group)
		}
		groups[cfg.Group] = true
		s.members = append(s.members, &Member{
			db: db, cfg: cfg, sql: s.sql, set: s,
			log:   cfg.Logger.With(slog.String("group", cfg.Group), slog.String("owner", cfg.Owner)),
			parts: map[int]*held{}, changed: make(chan struct{}), batchEnded: make(chan struct{}, 1),
		})
	}
	return s, slices.Clone(s.members), nil
}

// poke asks Run for a round now.
func (s *Set) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run keeps the memberships until ctx ends or every member has closed (then ErrClosed): a
// round at once, then one every Renew (and after a batch ends on a partition being given
// back), and one as soon as another member's lease or membership lapses in any of the groups
// if that comes before the next renewal, so a dead member's partitions are claimed when its
// leases lapse, not up to Renew later. A failed round is logged and retried at the next; the
// leases then lapse after TTL, as a dead member's would.
func (s *Set) Run(ctx context.Context) error {
	for {
		if len(s.live()) == 0 {
			return ErrClosed
		}
		start := time.Now()
		lapse, err := s.round(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			s.members[0].cfg.Logger.WarnContext(ctx, "lease: round failed; retried at the next", slog.String("owner", s.owner),
				slog.Int("groups", len(s.members)), slog.Any("error", err))
		}
		next, stop := s.newTimer(nextRound(start, s.every, lapse))
		select {
		case <-ctx.Done():
		case <-next:
			continue
		case <-s.wake:
			stop()
			continue
		}
		stop()
		break
	}
	if len(s.live()) == 0 {
		return ErrClosed
	}
	return ctx.Err()
}

// live returns the members that have not left their group.
func (s *Set) live() []*Member {
	var out []*Member
	for _, m := range s.members {
		if !m.hasLeft() {
			out = append(out, m)
		}
	}
	return out
}

// renewal is what a round's first statement says of one group.
type renewal struct {
	members, rank int
	renewed       []int
	// lapse is the seconds until the next lapse of another member's lease or membership in
	// the group, nil when none will.
	lapse *float64
}

// change is what a committed round changed of one member.
type change struct {
	m            *Member
	gained, lost []int
}

// round renews the live members' memberships and leases, then gives back the partitions over
// each one's fair share (once no batch of them is in flight) and claims free ones up to it, in
// one transaction for all the groups. It returns when the next lease or membership of another
// member lapses in any group (on this process's clock, read from the database's as a
// duration), zero when none will.
func (s *Set) round(ctx context.Context) (time.Time, error) {
	s.rounding.Lock()
	defer s.rounding.Unlock()
	ms := s.live()
	if err := s.seed(ctx, ms); err != nil {
		return time.Time{}, err
	}
	var (
		lapse   time.Time
		changes []change
	)
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		groups, partitions, active := make([]string, len(ms)), make([]int, len(ms)), make([]bool, len(ms))
		for i, m := range ms {
			m.mu.Lock()
			groups[i], partitions[i], active[i] = m.cfg.Group, m.cfg.Partitions, !m.closed // a closing member gives everything back
			m.mu.Unlock()
		}
		got, err := s.renew(ctx, tx, groups, partitions, active)
		if err != nil {
			return err
		}
		pl := planRound(ms, active, got, time.Now()) // after the database's answer: a lapse is never earlier than its
		lapse = pl.lapse
		if len(pl.giveGroups) > 0 {
			if _, err := tx.Exec(ctx, s.sql.release, s.owner, pl.giveGroups, pl.givePartitions); err != nil {
				return fmt.Errorf("lease: give back: %w", err)
			}
		}
		claimed, err := s.claim(ctx, tx, pl.claimGroups, pl.claimCount, pl.claimWant)
		if err != nil {
			return err
		}
		changes = changes[:0]
		for i, m := range ms {
			gained, lost := m.plan(got[m.cfg.Group].renewed, pl.given[i], claimed[m.cfg.Group])
			changes = append(changes, change{m: m, gained: gained, lost: lost})
		}
		return nil
	})
	if err != nil {
		return time.Time{}, err
	}
	for _, c := range changes {
		c.m.apply(c.gained, c.lost)
		if len(c.gained) > 0 || len(c.lost) > 0 {
			c.m.log.InfoContext(ctx, "lease: partitions moved", slog.Any("claimed", c.gained), slog.Any("lost", c.lost), slog.Any("owned", c.m.Owned()))
		}
	}
	return lapse, nil
}

// roundPlan is what a round gives back and claims, as the statements take them, and the next
// lapse of another member's lease or membership in any group.
type roundPlan struct {
	giveGroups, claimGroups []string
	givePartitions          []int
	claimCount, claimWant   []int
	// given are the partitions each member (ms's order) gives back now.
	given [][]int
	lapse time.Time
}

// planRound plans a round of ms (active: which keep their membership) from what its first
// statement returned (got), answered at answered: each member gives back the partitions over
// its fair share that no batch uses (planGiveBack) and claims up to its share.
func planRound(ms []*Member, active []bool, got map[string]renewal, answered time.Time) roundPlan {
	pl := roundPlan{given: make([][]int, len(ms))}
	for i, m := range ms {
		r := got[m.cfg.Group]
		share := 0
		if active[i] {
			share = fairShare(m.cfg.Partitions, r.members, r.rank)
		}
		m.mu.Lock()
		pl.given[i] = m.planGiveBack(r.renewed, share)
		m.mu.Unlock()
		for _, p := range pl.given[i] {
			pl.giveGroups, pl.givePartitions = append(pl.giveGroups, m.cfg.Group), append(pl.givePartitions, p)
		}
		if want := share - (len(r.renewed) - len(pl.given[i])); want > 0 {
			pl.claimGroups, pl.claimCount, pl.claimWant = append(pl.claimGroups, m.cfg.Group), append(pl.claimCount, m.cfg.Partitions), append(pl.claimWant, want)
		}
		if r.lapse != nil {
			if at := answered.Add(time.Duration(*r.lapse * float64(time.Second))); pl.lapse.IsZero() || at.Before(pl.lapse) {
				pl.lapse = at
			}
		}
	}
	return pl
}

// seed makes the lease rows of the groups of ms not seeded yet (a member's first round), in
// a statement of its own: rows inserted in one order by every member, so two sets seeding the
// same groups wait for each other at most once, never in a cycle.
func (s *Set) seed(ctx context.Context, ms []*Member) error {
	var (
		groups     []string
		partitions []int
		seeding    []*Member
	)
	for _, m := range ms {
		m.mu.Lock()
		if !m.seeded {
			groups, partitions, seeding = append(groups, m.cfg.Group), append(partitions, m.cfg.Partitions), append(seeding, m)
		}
		m.mu.Unlock()
	}
	if len(seeding) == 0 {
		return nil
	}
	if _, err := s.db.Exec(ctx, s.sql.seed, groups, partitions); err != nil {
		return fmt.Errorf("lease: seed the lease rows: %w", err)
	}
	for _, m := range seeding {
		m.mu.Lock()
		m.seeded = true
		m.mu.Unlock()
	}
	return nil
}

// renew renews the memberships of the active groups (a heartbeat that also forgets dead
// members) and the leases this owner holds in every group, and returns, per group, the live
// members (this one included), this member's rank among them, the partitions renewed and the
// next lapse of another member's lease or membership.
func (s *Set) renew(ctx context.Context, tx pgx.Tx, groups []string, partitions []int, active []bool) (map[string]renewal, error) {
	rows, err := tx.Query(ctx, s.sql.round, s.owner, groups, partitions, active, s.ttl.Seconds())
	if err != nil {
		return nil, fmt.Errorf("lease: renew: %w", err)
	}
	got := make(map[string]renewal, len(groups))
	var (
		group string
		r     renewal
	)
	_, err = pgx.ForEachRow(rows, []any{&group, &r.members, &r.rank, &r.renewed, &r.lapse}, func() error {
		got[group] = r
		r = renewal{}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("lease: renew: %w", err)
	}
	if s.beforeClaim != nil {
		s.beforeClaim()
	}
	return got, nil
}

// claim claims, in each of groups, up to want free partitions (below its count) and returns
// them by group.
func (s *Set) claim(ctx context.Context, tx pgx.Tx, groups []string, count, want []int) (map[string][]int, error) {
	claimed := map[string][]int{}
	if len(groups) == 0 {
		return claimed, nil
	}
	rows, err := tx.Query(ctx, s.sql.claim, s.owner, s.ttl.Seconds(), groups, count, want)
	if err != nil {
		return nil, fmt.Errorf("lease: claim: %w", err)
	}
	var (
		group string
		p     int
	)
	_, err = pgx.ForEachRow(rows, []any{&group, &p}, func() error {
		claimed[group] = append(claimed[group], p)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("lease: claim: %w", err)
	}
	return claimed, nil
}
