package lease_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/lease"
	"github.com/nudgeworks/nudge/postgres"
)

func TestNewSetConfig(t *testing.T) {
	t.Parallel()
	a, b := lease.Config{Group: "a", Partitions: 2}, lease.Config{Group: "b", Partitions: 3}
	for name, cfgs := range map[string][]lease.Config{
		"none":              nil,
		"a group twice":     {a, a},
		"another TTL":       {a, {Group: "b", Partitions: 3, TTL: time.Minute}},
		"another owner":     {{Group: "a", Partitions: 2, Owner: "x"}, {Group: "b", Partitions: 3, Owner: "y"}},
		"another schema":    {a, {Group: "b", Partitions: 3, Schema: "other"}},
		"an invalid member": {a, {Group: "b"}},
	} {
		_, _, err := lease.NewSet(nopDB{}, cfgs...)
		require.ErrorIs(t, err, lease.ErrInvalidConfig, name)
	}
	_, ms, err := lease.NewSet(nopDB{}, a, b)
	require.NoError(t, err)
	require.Len(t, ms, 2)
	require.NotEmpty(t, ms[0].Owner())
	require.Equal(t, ms[0].Owner(), ms[1].Owner(), "a member without an Owner takes the first's")
}

// countingDB counts the transactions begun on its DB.
type countingDB struct {
	postgres.DB
	begins atomic.Int64
}

func (c *countingDB) Begin(ctx context.Context) (pgx.Tx, error) {
	c.begins.Add(1)
	return c.DB.Begin(ctx)
}

// fleet is two owners' sets over the same groups, in one test's database.
type fleet struct {
	t      *testing.T
	db     *pgtest.DB
	groups map[string]int // group → partitions
}

// start runs a set of every group for owner on db (the test's pool when nil) and returns its
// members by group and a function that stops its rounds without giving anything back.
func (f *fleet) start(owner string, db postgres.DB, ttl time.Duration, timer *manualTimer) (map[string]*lease.Member, func()) {
	f.t.Helper()
	if db == nil {
		db = f.db.Pool
	}
	var cfgs []lease.Config
	for g, n := range f.groups {
		cfgs = append(cfgs, lease.Config{Group: g, Partitions: n, Owner: owner, TTL: ttl, Renew: min(testRenew, ttl/4)})
	}
	set, ms, err := lease.NewSet(db, cfgs...)
	require.NoError(f.t, err)
	if timer != nil {
		lease.SetTimer(ms[0], timer.newTimer)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- set.Run(ctx) }()
	var once atomic.Bool
	stop := func() {
		if once.CompareAndSwap(false, true) {
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) && !errors.Is(err, lease.ErrClosed) {
				f.t.Errorf("set %s: Run: %v", owner, err)
			}
		}
	}
	f.t.Cleanup(stop)
	byGroup := map[string]*lease.Member{}
	for i, m := range ms {
		byGroup[cfgs[i].Group] = m
	}
	return byGroup, stop
}

// owners returns, per group, how many partitions each owner holds ("" for none).
func (f *fleet) owners() map[string]map[string]int {
	f.t.Helper()
	out := map[string]map[string]int{}
	for g, n := range f.groups {
		ls, err := lease.Leases(context.Background(), f.db.Pool, "", g, n)
		require.NoError(f.t, err)
		out[g] = map[string]int{}
		for _, l := range ls {
			out[g][l.Owner]++
		}
	}
	return out
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	db := pgtest.New(t)
	require.NoError(t, postgres.Migrate(context.Background(), db.Pool, ""))
	return &fleet{t: t, db: db, groups: map[string]int{"orders": 4, "invoices": 3, "tickets": 5}}
}

// Two workers' sets split every group evenly; when one dies, the other takes every group's
// partitions over; Close gives a group back at once.
func TestSetsSplitEveryGroup(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	a, stopA := f.start("a", nil, testTTL, nil)
	b, _ := f.start("b", nil, testTTL, nil)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for g, counts := range f.owners() {
			n := f.groups[g]
			assert.Equal(c, map[string]int{"a": (n + 1) / 2, "b": n / 2}, counts, g)
			assert.Len(c, a[g].Owned(), (n+1)/2, g)
			assert.Len(c, b[g].Owned(), n/2, g)
		}
	}, waitFor, 10*time.Millisecond, "a and b split every group")

	stopA()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for g, counts := range f.owners() {
			assert.Equal(c, map[string]int{"b": f.groups[g]}, counts, g)
			assert.Len(c, b[g].Owned(), f.groups[g], g)
		}
	}, waitFor, 10*time.Millisecond, "b took every group over once a's leases lapsed")

	require.NoError(t, b["orders"].Close(context.Background()))
	require.Empty(t, b["orders"].Owned())
	require.Equal(t, map[string]int{"": 4}, f.owners()["orders"], "closing gave orders back at once")
	require.Len(t, b["tickets"].Owned(), 5, "the set's other groups are kept")
}

// One round renews, gives back and claims in every group of a set: one transaction, however
// many groups. A survivor's round at the lapse of a dead worker's leases claims its partitions
// in all the groups at once.
func TestSetRoundCoversEveryGroup(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.groups = map[string]int{}
	for k := range 20 {
		f.groups[fmt.Sprintf("g%02d", k)] = 2
	}
	_, stopA := f.start("a", nil, time.Minute, nil)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for g, counts := range f.owners() {
			assert.Equal(c, map[string]int{"a": 2}, counts, g)
		}
	}, waitFor, 10*time.Millisecond, "a owns everything")
	stopA()
	// a's last renewal was, say, TTL - 1 s ago: its leases and memberships lapse in 1 s.
	ctx := context.Background()
	for _, table := range lease.Tables() {
		_, err := f.db.Pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET expires_at = now() + interval '1 second' WHERE owner = 'a'`, table))
		require.NoError(t, err)
	}

	db := &countingDB{DB: f.db.Pool}
	mt := newManualTimer()
	b, _ := f.start("b", db, time.Minute, mt)
	wait := mt.next(t)
	require.Equal(t, int64(1), db.begins.Load(), "the first round of 20 groups is one transaction")
	require.LessOrEqual(t, wait, time.Second+100*time.Millisecond, "b's next round comes when a's leases lapse")
	for g, m := range b {
		require.Empty(t, m.Owned(), "%s: a's leases are live at b's first round", g)
	}

	require.Eventually(t, func() bool {
		var live bool
		require.NoError(t, f.db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM nudge_partition_members WHERE owner = 'a' AND expires_at >= now())
			OR EXISTS (SELECT FROM nudge_partition_leases WHERE owner = 'a' AND expires_at >= now())`).Scan(&live))
		return !live
	}, waitFor, 10*time.Millisecond, "a's leases and memberships lapse")
	mt.fire <- time.Now()
	mt.next(t)
	require.Equal(t, int64(2), db.begins.Load(), "the takeover round of 20 groups is one transaction")
	for g, m := range b {
		require.Equal(t, []int{0, 1}, m.Owned(), "%s: taken over at the round at the lapse", g)
	}
	require.Equal(t, map[string]int{"b": 2}, f.owners()["g07"])
}

// TestCloseDuringARound: a member that closes while a round of its set is in flight (here held
// after its renewals, about to claim) leaves nothing behind: the round cannot claim for it after
// it left its group, or its partitions would stay with an owner that no longer renews them
// until their lease lapsed.
func TestCloseDuringARound(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.groups = map[string]int{"orders": 2}
	held, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	set, ms, err := lease.NewSet(f.db.Pool, lease.Config{Group: "orders", Partitions: 2, Owner: "a", TTL: time.Minute})
	require.NoError(t, err)
	mt := newManualTimer()
	lease.SetTimer(ms[0], mt.newTimer)
	lease.SetBeforeClaim(ms[0], func() {
		if first.CompareAndSwap(false, true) {
			close(held)
			<-release
		}
	})
	waiting := make(chan struct{})
	lease.SetLeaveWaits(ms[0], func() { close(waiting) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- set.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.ErrorIs(t, <-done, lease.ErrClosed, "its only member left")
	})

	<-held // the first round renewed (nothing yet) and is about to claim both partitions
	closed := make(chan error, 1)
	go func() { closed <- ms[0].Close(context.Background()) }()
	// Close either waits for the held round (it says so) or leaves during it and returns.
	select {
	case <-waiting:
	case err := <-closed:
		require.NoError(t, err)
		close(release)
		require.Fail(t, "Close left the group while a round was in flight")
	}
	close(release)
	require.NoError(t, <-closed)
	mt.next(t) // the held round has ended
	require.Empty(t, ms[0].Owned())
	require.Equal(t, map[string]int{"": 2}, f.owners()["orders"], "nothing claimed for a member that left")
	var members int
	require.NoError(t, f.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM nudge_partition_members`).Scan(&members))
	require.Zero(t, members, "no membership left behind")
}
