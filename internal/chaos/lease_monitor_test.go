package main

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/chaos/chaosmodel"
	"github.com/nudgeworks/nudge/lease"
	"github.com/nudgeworks/nudge/projection"
)

func leaseList(owners ...string) []lease.Lease {
	out := make([]lease.Lease, len(owners))
	for k, o := range owners {
		out[k] = lease.Lease{Partition: k, Owner: o}
	}
	return out
}

// TestLeaseMonitorRecordsTheLongestTimeWithoutALiveOwner: a partition whose owner died counts
// as without one from the last poll that saw it live until a live owner holds it again, in
// the table or not; the table's own count starts when the lease lapses; nothing counts before
// arm; intervals still open at the end count up to it.
func TestLeaseMonitorRecordsTheLongestTimeWithoutALiveOwner(t *testing.T) {
	m := newLeaseMonitor(nil, []string{"g"}, 3, nil, slog.Default())
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	both := map[string]bool{"a": true, "b": true}

	m.observe(at(0), leaseList("", "", ""), both) // before arm: not recorded
	m.observe(at(100), leaseList("a", "b", "a"), both)
	m.arm()
	m.observe(at(200), leaseList("a", "b", "a"), map[string]bool{"a": true}) // b died: its lease is still listed
	m.observe(at(300), leaseList("a", "", "a"), map[string]bool{"a": true})  // and lapsed
	m.observe(at(1300), leaseList("a", "a", "a"), map[string]bool{"a": true})
	m.observe(at(2000), leaseList("a", "a", ""), map[string]bool{"a": true})
	m.end(at(2500))

	require.Equal(t, []time.Duration{0, 1200 * time.Millisecond, 1200 * time.Millisecond}, m.longest,
		"partition 1 from 100 ms (last seen live) to 1300 ms; partition 2 from 1300 ms (last seen owned) to the end")
	require.Equal(t, []time.Duration{0, 1100 * time.Millisecond, 1200 * time.Millisecond}, m.tableLongest,
		"partition 1 without an owner in the table from 200 ms (last seen there) to 1300 ms")
	live, partition, table := m.worst()
	require.Equal(t, 1200*time.Millisecond, live)
	require.Equal(t, 1, partition, "the first partition with the longest")
	require.Equal(t, 1200*time.Millisecond, table)
	require.Equal(t, 6, m.polls)
}

func TestSpreadOf(t *testing.T) {
	s := spreadOf([]string{"a", "b", "a", "c"}, []string{"a", "b", "c"}, t0)
	require.True(t, s.allOwned)
	require.True(t, s.fair, "2, 1, 1")
	require.Equal(t, "a:2 b:1 c:1", s.String())

	s = spreadOf([]string{"a", "a", "a", "b"}, []string{"a", "b"}, t0)
	require.True(t, s.allOwned)
	require.False(t, s.fair, "3 against 1")

	s = spreadOf([]string{"a", "a"}, []string{"a", "b"}, t0)
	require.False(t, s.fair, "a live owner without a partition counts as 0")

	s = spreadOf([]string{"a", ""}, []string{"a"}, t0)
	require.False(t, s.allOwned, "a partition without an owner")
	s = spreadOf([]string{"a", "x"}, []string{"a"}, t0)
	require.False(t, s.allOwned, "an owner not among the live ones (a worker being stopped)")
	s = spreadOf(nil, []string{"a"}, t0)
	require.False(t, s.allOwned, "no poll yet")
}

// TestUnitsCaughtUpTo: a partition whose position stays at its own last event is caught up to
// a later position once it has no lag against a head at or past it.
func TestUnitsCaughtUpTo(t *testing.T) {
	pos := func(g int64) eventstore.Position { return eventstore.Position{TransactionID: 10, GlobalPosition: g} }
	require.True(t, unitsCaughtUpTo(projection.Status{Position: pos(5)}, pos(5)))
	require.False(t, unitsCaughtUpTo(projection.Status{Position: pos(4), Head: pos(9)}, pos(5)), "unpartitioned: the position decides")

	part := func(at, head int64, lag int64) projection.Status {
		return projection.Status{Position: pos(at), Head: pos(head), LagEvents: lag}
	}
	folded := func(parts ...projection.Status) projection.Status {
		return projection.FoldPartitions(chaosmodel.ExactProjection, parts)
	}
	require.True(t, unitsCaughtUpTo(folded(part(9, 9, 0), part(3, 9, 0)), pos(9)), "partition 1's last event is at 3")
	require.False(t, unitsCaughtUpTo(folded(part(9, 9, 0), part(3, 9, 2)), pos(9)), "partition 1 has lag")
	require.False(t, unitsCaughtUpTo(folded(part(9, 9, 0), part(3, 4, 0)), pos(9)), "partition 1's head is behind pos")
}

func TestModelNames(t *testing.T) {
	require.Equal(t, []string{chaosmodel.ExactProjection}, scenarioSettings{exactOnly: true}.modelNames())
	require.ElementsMatch(t, chaosmodel.Names(), scenarioSettings{}.modelNames())
	// The lease groups: the split models only.
	require.Nil(t, scenarioSettings{exactOnly: true}.splitNames())
	require.Equal(t, []string{chaosmodel.ExactProjection}, scenarioSettings{exactOnly: true, partitions: 16}.splitNames())
	require.Equal(t, []string{chaosmodel.ExactProjection, chaosmodel.FleetProjection(1), chaosmodel.FleetProjection(2)},
		scenarioSettings{exactOnly: true, partitions: 64, fleet: 50, fleetSplit: 3}.splitNames())
	require.Len(t, scenarioSettings{exactOnly: true, partitions: 64, fleet: 50, fleetSplit: 50}.splitNames(), 50)
}

// TestLeaseMonitorOfSeveralGroups: with several groups the spread is fair only when every
// group's partitions are shared fairly, and the slots are named by group and partition.
func TestLeaseMonitorOfSeveralGroups(t *testing.T) {
	m := newLeaseMonitor(nil, []string{"g1", "g2"}, 2, nil, slog.Default())
	t0 := time.Now()
	both := map[string]bool{"a": true, "b": true}
	m.observe(t0, leaseList("a", "b", "a", "a"), both) // g2 is all a's
	sp, _ := m.spreadOver([]string{"a", "b"})
	require.True(t, sp.allOwned)
	require.False(t, sp.fair, "g2's partitions are not shared")
	require.Equal(t, map[string]int{"a": 3, "b": 1}, sp.counts)
	m.observe(t0.Add(time.Second), leaseList("a", "b", "b", "a"), both)
	sp, _ = m.spreadOver([]string{"a", "b"})
	require.True(t, sp.fair)
	require.Equal(t, "g2 partition 1", m.slotName(3))
}

// TestAllLeavesOutOptInScenarios: "all" runs every scenario but the opt-in ones, which run
// when named.
func TestAllLeavesOutOptInScenarios(t *testing.T) {
	all := scenarios()
	picked, err := selectScenarios(all, "all")
	require.NoError(t, err)
	require.Len(t, picked, len(all)-1)
	for _, sc := range picked {
		require.NotEqual(t, "scale-fleet", sc.name)
	}
	picked, err = selectScenarios(all, "scale-fleet")
	require.NoError(t, err)
	require.Equal(t, "scale-fleet", picked[0].name)
}
