package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/lease"
	"github.com/nudgeworks/nudge/postgres"
)

// leaseMonitor polls the lease table of a partitioned projection (lease.Leases) and records, for
// each partition, the longest time it went without a live owner: no lease in the table (no
// owner, or an expired lease, which lease.Leases lists without one), or a lease held by a
// process the suite has killed or stopped, which nobody runs until the lease lapses.
//
// An interval runs from the last poll that saw the partition with a live owner to the first
// that sees it with one again, so it errs long by at most a poll interval (and a poll's own
// time), never short.
type leaseMonitor struct {
	db postgres.DB
	// groups are the partitioned projections watched, each of partitions partitions; the
	// monitor's slots are every group's partitions in turn (n of them).
	groups     []string
	partitions int
	n          int
	// alive reports the owners (worker incarnations) that run now.
	alive func() map[string]bool
	log   *slog.Logger

	mu sync.Mutex
	// owners is the last poll's owner of each partition, "" for none live; at is its time.
	owners []string
	at     time.Time
	polled chan struct{} // closed and replaced after every poll
	// armed: intervals are recorded (from arm on: before it no worker ran yet).
	armed bool
	// since is when each partition was last seen with a live owner while it has none now;
	// zero while it has one.
	since []time.Time
	// longest is each partition's longest interval without a live owner; tableLongest the
	// same counting only the partitions the table lists without an owner.
	longest, tableLongest []time.Duration
	tableSince            []time.Time
	polls, failures       int
}

// leaseMonitorPoll is how often the monitor reads the lease table.
const leaseMonitorPoll = 100 * time.Millisecond

func newLeaseMonitor(db postgres.DB, groups []string, partitions int, alive func() map[string]bool, log *slog.Logger) *leaseMonitor {
	n := len(groups) * partitions
	return &leaseMonitor{db: db, groups: groups, partitions: partitions, n: n, alive: alive, log: log, polled: make(chan struct{}),
		since: make([]time.Time, n), tableSince: make([]time.Time, n),
		longest: make([]time.Duration, n), tableLongest: make([]time.Duration, n)}
}

// poll reads the live leases of every group, numbered as the monitor's slots.
func (m *leaseMonitor) poll(ctx context.Context) ([]lease.Lease, error) {
	if len(m.groups) == 1 {
		return lease.Leases(ctx, m.db, "", m.groups[0], m.partitions)
	}
	rows, err := m.db.Query(ctx, `SELECT grp, partition, owner FROM `+lease.Tables()[0]+`
		WHERE grp = ANY($1) AND partition < $2 AND owner IS NOT NULL AND expires_at >= now()`, m.groups, m.partitions)
	if err != nil {
		return nil, err
	}
	index := make(map[string]int, len(m.groups))
	for g, name := range m.groups {
		index[name] = g
	}
	var (
		out   []lease.Lease
		group string
		l     lease.Lease
	)
	_, err = pgx.ForEachRow(rows, []any{&group, &l.Partition, &l.Owner}, func() error {
		out = append(out, lease.Lease{Partition: index[group]*m.partitions + l.Partition, Owner: l.Owner})
		return nil
	})
	return out, err
}

// slotName names slot k: its partition, and its group when there are several.
func (m *leaseMonitor) slotName(k int) string {
	if len(m.groups) == 1 {
		return fmt.Sprintf("partition %d", k)
	}
	return fmt.Sprintf("%s partition %d", m.groups[k/m.partitions], k%m.partitions)
}

// run polls every leaseMonitorPoll until ctx ends.
func (m *leaseMonitor) run(ctx context.Context) {
	tick := time.NewTicker(leaseMonitorPoll)
	defer tick.Stop()
	for {
		leases, err := m.poll(ctx)
		now := time.Now()
		switch {
		case err != nil && ctx.Err() == nil:
			m.mu.Lock()
			m.failures++
			m.mu.Unlock()
			m.log.Warn("lease monitor: poll failed", slog.Any("error", err))
		case err == nil:
			m.observe(now, leases, m.alive())
		}
		select {
		case <-ctx.Done():
			m.end(time.Now())
			return
		case <-tick.C:
		}
	}
}

// observe records one poll: the leases the table listed at time at, and the owners alive then.
func (m *leaseMonitor) observe(at time.Time, leases []lease.Lease, alive map[string]bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	owners := make([]string, m.n)
	inTable := make([]bool, m.n)
	for _, l := range leases {
		if l.Partition < 0 || l.Partition >= m.n || l.Owner == "" {
			continue
		}
		inTable[l.Partition] = true
		if alive[l.Owner] {
			owners[l.Partition] = l.Owner
		}
	}
	if m.armed {
		for k := range m.n {
			track(&m.since[k], &m.longest[k], m.at, at, owners[k] != "")
			track(&m.tableSince[k], &m.tableLongest[k], m.at, at, inTable[k])
		}
	}
	m.owners, m.at = owners, at
	m.polls++
	close(m.polled)
	m.polled = make(chan struct{})
}

// track updates one partition's open interval (since) and longest interval for a poll at
// time at, whose predecessor was at prev: an interval opens at prev, the last time the
// partition was seen owned, and closes at the first poll that sees it owned again.
func track(since *time.Time, longest *time.Duration, prev, at time.Time, owned bool) {
	switch {
	case !owned && since.IsZero():
		*since = prev
	case owned && !since.IsZero():
		*longest = max(*longest, at.Sub(*since))
		*since = time.Time{}
	}
}

// arm starts recording intervals at the last poll.
func (m *leaseMonitor) arm() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.armed = true
	for k := range m.n {
		if m.owners == nil || m.owners[k] == "" {
			m.since[k], m.tableSince[k] = m.at, m.at
		}
	}
}

// end closes the intervals still open at time at.
func (m *leaseMonitor) end(at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.armed {
		return
	}
	for k := range m.n {
		for _, iv := range []struct {
			since   *time.Time
			longest *time.Duration
		}{{&m.since[k], &m.longest[k]}, {&m.tableSince[k], &m.tableLongest[k]}} {
			if !iv.since.IsZero() {
				*iv.longest = max(*iv.longest, at.Sub(*iv.since))
				*iv.since = time.Time{}
			}
		}
	}
}

// worst returns the longest interval without a live owner over every partition and which
// partition had it, and the longest without any owner in the table.
func (m *leaseMonitor) worst() (live time.Duration, partition int, table time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, d := range m.longest {
		if d > live {
			live, partition = d, k
		}
	}
	return live, partition, slices.Max(m.tableLongest)
}

// spread describes the last poll against the live owners expected: whether every partition
// is held by one of them, whether they hold their fair shares (counts differ by at most one,
// owners without a partition included), the time of that poll and the counts.
type spread struct {
	at             time.Time
	allOwned, fair bool
	counts         map[string]int
}

func (s spread) String() string {
	owners := make([]string, 0, len(s.counts))
	for o := range s.counts {
		owners = append(owners, o)
	}
	slices.Sort(owners)
	var b strings.Builder
	for i, o := range owners {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s:%d", o, s.counts[o])
	}
	return b.String()
}

// spreadOver is the last poll's spread over the owners live.
func (m *leaseMonitor) spreadOver(live []string) (spread, <-chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.owners == nil || len(m.groups) == 1 {
		return spreadOf(m.owners, live, m.at), m.polled
	}
	all := spread{at: m.at, allOwned: true, fair: true, counts: map[string]int{}}
	for g := range m.groups {
		sp := spreadOf(m.owners[g*m.partitions:(g+1)*m.partitions], live, m.at)
		all.allOwned = all.allOwned && sp.allOwned
		all.fair = all.fair && sp.fair
		for o, n := range sp.counts {
			all.counts[o] += n
		}
	}
	return all, m.polled
}

// spreadOf is the spread of owners (a partition's owner, "" for none) over live.
func spreadOf(owners, live []string, at time.Time) spread {
	s := spread{at: at, allOwned: owners != nil, counts: map[string]int{}}
	for _, o := range live {
		s.counts[o] = 0
	}
	for _, o := range owners {
		if _, ok := s.counts[o]; !ok {
			s.allOwned = false // no owner, or one not expected
			continue
		}
		s.counts[o]++
	}
	lo, hi := len(owners), 0
	for _, n := range s.counts {
		lo, hi = min(lo, n), max(hi, n)
	}
	s.fair = s.allOwned && hi-lo <= 1
	return s
}

// await waits until the poll's spread over live satisfies ok, up to bound; it returns the
// first poll's spread that did, or the last one and false.
func (m *leaseMonitor) await(ctx context.Context, live []string, bound time.Duration, ok func(spread) bool) (spread, bool) {
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		s, next := m.spreadOver(live)
		if ok(s) {
			return s, true
		}
		select {
		case <-next:
		case <-timer.C:
			return s, false
		case <-ctx.Done():
			return s, false
		}
	}
}
