package lease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/lease"
	"github.com/nudgeworks/nudge/postgres"
)

// Short times so a test's rounds and expiries pass quickly; every wait awaits a condition.
const (
	testTTL   = 1200 * time.Millisecond
	testRenew = 100 * time.Millisecond
)

var waitFor = testwait.For(30 * time.Second)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]lease.Config{
		"no group":           {Partitions: 4},
		"no partitions":      {Group: "g"},
		"too many":           {Group: "g", Partitions: lease.MaxPartitions + 1},
		"renew over ttl / 2": {Group: "g", Partitions: 4, TTL: time.Second, Renew: 600 * time.Millisecond},
	} {
		_, err := lease.New(nopDB{}, cfg)
		require.ErrorIs(t, err, lease.ErrInvalidConfig, name)
	}
	_, err := lease.New(nil, lease.Config{Group: "g", Partitions: 1})
	require.ErrorIs(t, err, lease.ErrInvalidConfig)
	cfg := lease.Config{Group: "g", Partitions: 3}.WithDefaults()
	require.Equal(t, lease.TTLDefault, cfg.TTL)
	require.Equal(t, lease.RenewDefault, cfg.Renew)
	require.NotEmpty(t, cfg.Owner)
	require.NotEqual(t, cfg.Owner, lease.Config{Group: "g", Partitions: 3}.WithDefaults().Owner, "owners are unique per member")
}

// nopDB is a non-nil postgres.DB for config tests; it is never called.
type nopDB struct{ postgres.DB }

// group is one test's database with the lease tables and its members.
type group struct {
	t          *testing.T
	db         *pgtest.DB
	name       string
	partitions int
	// ttl is the members' lease time: testTTL, or longer for a test in which no lease may
	// lapse on a busy machine.
	ttl     time.Duration
	mu      sync.Mutex
	stops   map[string]context.CancelFunc
	members map[string]*lease.Member
}

func newGroup(t *testing.T, partitions int) *group {
	t.Helper()
	db := pgtest.New(t)
	require.NoError(t, postgres.Migrate(context.Background(), db.Pool, ""))
	return &group{t: t, db: db, name: "tickets", partitions: partitions, ttl: testTTL, stops: map[string]context.CancelFunc{}, members: map[string]*lease.Member{}}
}

// join starts a member called owner.
func (g *group) join(owner string) *lease.Member {
	g.t.Helper()
	m, err := lease.New(g.db.Pool, lease.Config{Group: g.name, Partitions: g.partitions, Owner: owner, TTL: g.ttl, Renew: testRenew})
	require.NoError(g.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	g.t.Cleanup(func() {
		cancel()
		err := <-done
		if !errors.Is(err, context.Canceled) && !errors.Is(err, lease.ErrClosed) {
			g.t.Errorf("member %s: Run: %v", owner, err)
		}
	})
	g.mu.Lock()
	g.stops[owner], g.members[owner] = cancel, m
	g.mu.Unlock()
	return m
}

// kill stops a member's renewals without giving anything back, as a SIGKILL would.
func (g *group) kill(owner string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stops[owner]()
	delete(g.members, owner)
}

// leases returns the owner of each partition ("" for none) as the table says.
func (g *group) leases() []lease.Lease {
	g.t.Helper()
	ls, err := lease.Leases(context.Background(), g.db.Pool, "", g.name, g.partitions)
	require.NoError(g.t, err)
	return ls
}

// balanced reports whether every partition is owned, by the live members only, each within
// one of the others, and whether each member's Owned agrees with the table.
func (g *group) balanced() (bool, string) {
	ls := g.leases()
	counts := map[string]int{}
	for _, l := range ls {
		if l.Owner == "" {
			return false, fmt.Sprintf("partition %d unowned", l.Partition)
		}
		counts[l.Owner]++
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(counts) != len(g.members) {
		return false, fmt.Sprintf("owners %v, members %d", counts, len(g.members))
	}
	lo, hi := g.partitions, 0
	for owner, m := range g.members {
		n := counts[owner]
		lo, hi = min(lo, n), max(hi, n)
		var want []int
		for _, l := range ls {
			if l.Owner == owner {
				want = append(want, l.Partition)
			}
		}
		if !slices.Equal(m.Owned(), want) {
			return false, fmt.Sprintf("%s owns %v, the table says %v", owner, m.Owned(), want)
		}
	}
	return hi-lo <= 1, fmt.Sprintf("counts %v", counts)
}

func (g *group) awaitBalanced(msg string) {
	g.t.Helper()
	require.EventuallyWithT(g.t, func(c *assert.CollectT) {
		ok, why := g.balanced()
		assert.True(c, ok, "%s: %s", msg, why)
	}, waitFor, 10*time.Millisecond, msg)
}

func TestOneMemberOwnsEveryPartition(t *testing.T) {
	t.Parallel()
	g := newGroup(t, 16)
	m := g.join("a")
	g.awaitBalanced("a alone")
	require.Len(t, m.Owned(), 16)
}

func TestMembersSplitEvenlyAndRebalance(t *testing.T) {
	t.Parallel()
	g := newGroup(t, 16)
	g.join("a")
	g.awaitBalanced("1 member")
	for _, o := range []string{"b", "c", "d"} {
		g.join(o)
	}
	g.awaitBalanced("4 members")
	for _, l := range g.leases() {
		require.NotEmpty(t, l.Owner)
	}
	// Leaving gives the partitions back at once; the others take them at their next round.
	g.mu.Lock()
	c := g.members["c"]
	delete(g.members, "c")
	g.mu.Unlock()
	require.NoError(t, c.Close(context.Background()))
	require.Empty(t, c.Owned())
	g.awaitBalanced("3 members after c left")
}

func TestDeadMemberIsTakenOverAfterItsLease(t *testing.T) {
	t.Parallel()
	g := newGroup(t, 8)
	g.join("a")
	g.join("b")
	g.awaitBalanced("2 members")
	var bs []lease.Lease
	for _, l := range g.leases() {
		if l.Owner == "b" {
			bs = append(bs, l)
		}
	}
	require.Len(t, bs, 4)
	g.kill("b")
	g.awaitBalanced("a took b's partitions over")
	for _, l := range g.leases() {
		require.Equal(t, "a", l.Owner)
	}
	// None of b's partitions was claimed before b's lease on it could have expired: the
	// takeover's acquired_at (database time) is past the expiry b's last renewal set, which
	// was at or after the one read above.
	byPart := map[int]lease.Lease{}
	for _, l := range g.leases() {
		byPart[l.Partition] = l
	}
	for _, l := range bs {
		require.False(t, byPart[l.Partition].AcquiredAt.Before(l.ExpiresAt), "partition %d claimed at %s, before b's lease ran out at %s",
			l.Partition, byPart[l.Partition].AcquiredAt, l.ExpiresAt)
	}
}

func TestPartitionInUseMovesOnlyAfterItsBatch(t *testing.T) {
	t.Parallel()
	g := newGroup(t, 2)
	g.ttl = time.Hour // a's lease must not lapse while its batch is held
	a := g.join("a")
	g.awaitBalanced("a alone")
	// A batch of partition 1 is in flight on a when b joins: a must give 1 back (its share is
	// now 1, the highest goes), but only once the batch is done.
	done, ok := a.Use(1)
	require.True(t, ok)
	b := g.join("b")
	require.Eventually(t, func() bool {
		release, used := a.Use(1)
		if used {
			release()
		}
		return !used // a is giving it back: no new batch starts on it
	}, waitFor, 5*time.Millisecond)
	// a's round decided to give partition 1 back but deferred it: the batch is in flight.
	for _, l := range g.leases() {
		require.Equal(t, "a", l.Owner, "partition %d: a's batch on partition 1 is still in flight", l.Partition)
	}
	require.Contains(t, a.Owned(), 1)
	require.Empty(t, b.Owned())
	done()
	g.awaitBalanced("partition 1 moved to b after a's batch")
	require.Equal(t, []int{0}, a.Owned())
	require.Equal(t, []int{1}, b.Owned())
	_, ok = a.Use(1)
	require.False(t, ok, "a no longer holds partition 1")
}

func TestScaleOutAndIn(t *testing.T) {
	t.Parallel()
	g := newGroup(t, 16)
	var n int
	scaleTo := func(want int) {
		for n < want {
			g.join(fmt.Sprintf("w%02d", n))
			n++
		}
		for live := len(g.members); live > want; live-- {
			g.mu.Lock()
			var owner string
			for o := range g.members {
				owner = max(owner, o)
			}
			m := g.members[owner]
			delete(g.members, owner)
			g.mu.Unlock()
			require.NoError(t, m.Close(context.Background()))
		}
		g.awaitBalanced(fmt.Sprintf("%d members", want))
	}
	for _, want := range []int{1, 4, 8, 2} {
		scaleTo(want)
	}
}

func TestCloseWaitsForBatchesInFlight(t *testing.T) {
	t.Parallel()
	g := newGroup(t, 2)
	g.ttl = time.Hour // nothing may lapse while the batch is held
	a := g.join("a")
	g.awaitBalanced("a alone")
	done, ok := a.Use(0)
	require.True(t, ok)
	g.mu.Lock()
	delete(g.members, "a")
	g.mu.Unlock()
	closed := make(chan error, 1)
	go func() { closed <- a.Close(context.Background()) }()
	// Closing gives back what no batch uses at once; partition 0 stays a's while its batch runs.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		ls := g.leases()
		assert.Empty(c, ls[1].Owner, "partition 1 given back")
		assert.Equal(c, "a", ls[0].Owner, "partition 0 is in use")
	}, waitFor, 10*time.Millisecond)
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a batch was in flight", err)
	default:
	}
	_, ok = a.Use(1)
	require.False(t, ok, "no new batch once closing")
	done()
	require.NoError(t, <-closed)
	require.Empty(t, a.Owned())
	require.Empty(t, g.leases()[0].Owner, "given back once its batch ended")
}

// manualTimer schedules a member's rounds by hand: each wait the member asks for is sent on
// asked, and the round runs when the test sends on fire.
type manualTimer struct {
	asked chan time.Duration
	fire  chan time.Time
}

func newManualTimer() *manualTimer {
	return &manualTimer{asked: make(chan time.Duration, 16), fire: make(chan time.Time)}
}

func (mt *manualTimer) newTimer(d time.Duration) (<-chan time.Time, func() bool) {
	mt.asked <- d
	return mt.fire, func() bool { return true }
}

// next returns the wait the member asked for after its last round.
func (mt *manualTimer) next(t *testing.T) time.Duration {
	t.Helper()
	select {
	case d := <-mt.asked:
		return d
	case <-time.After(waitFor):
		t.Fatal("the member asked for no timer: its round did not end")
		return 0
	}
}

// A survivor does not wait for its next renewal to take a dead member's partitions over: it
// schedules a round for the moment the dead member's leases lapse (database time), so the
// takeover comes TTL after the dead member's last renewal, not up to a renewal later. The
// rounds run when the test fires them, after the lapse has been observed in the database.
func TestSurvivorClaimsWhenTheLeaseLapses(t *testing.T) {
	t.Parallel()
	g := newGroup(t, 2)
	g.ttl = time.Minute // no lease lapses unless the test shortens it
	g.join("a")
	g.awaitBalanced("a owns both")
	g.kill("a")
	// a's last renewal was, say, TTL - 1 s ago: its lease and membership lapse in 1 s.
	ctx := context.Background()
	for _, table := range lease.Tables() {
		_, err := g.db.Pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET expires_at = now() + interval '1 second' WHERE owner = 'a'`, table))
		require.NoError(t, err)
	}

	renew := 20 * time.Second
	b, err := lease.New(g.db.Pool, lease.Config{Group: g.name, Partitions: 2, Owner: "b", TTL: g.ttl, Renew: renew})
	require.NoError(t, err)
	mt := newManualTimer()
	lease.SetTimer(b, mt.newTimer)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- b.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	})

	wait := mt.next(t)
	require.Empty(t, b.Owned(), "a's leases are live at b's first round")
	require.LessOrEqual(t, wait, time.Second+100*time.Millisecond,
		"b's next round must come when a's leases lapse (in 1 s), not at its next renewal (%s)", renew)

	require.Eventually(t, func() bool {
		// Both a's leases and its membership: a member still live at the round keeps a fair
		// share, and b would claim only its own half.
		for _, table := range lease.Tables() {
			var lapsed bool
			require.NoError(t, g.db.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT bool_and(expires_at < now()) FROM %s WHERE owner = 'a'`, table)).Scan(&lapsed))
			if !lapsed {
				return false
			}
		}
		return true
	}, waitFor, 10*time.Millisecond, "a's leases and membership lapse")
	changed := b.Changed()
	mt.fire <- time.Now()
	select {
	case <-changed:
	case <-time.After(waitFor):
		t.Fatal("b's round at the lapse claimed nothing")
	}
	require.Equal(t, []int{0, 1}, b.Owned(), "b took both partitions over at the round at the lapse")
	wait = mt.next(t)
	require.Greater(t, wait, 0*time.Second)
	require.LessOrEqual(t, wait, renew, "with no other lease to wait for, b renews every Renew")
}
