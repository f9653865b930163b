package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestFleetCases(t *testing.T) {
	t.Parallel()
	counts := []int{1, 10, 100, 300}
	quick := fleetCases(true, counts)
	require.Len(t, quick, 4)
	for i, c := range quick {
		require.Equal(t, fleetCase{channel: chAMQP, projections: counts[i], workers: 1}, c)
	}
	full := fleetCases(false, counts)
	require.Len(t, full, 16) // 2 channels × 2 worker counts × 4 projection counts
	require.Contains(t, full, fleetCase{channel: chPostgres, projections: 300, workers: 4})
	require.Equal(t, "RabbitMQ, 300 projection(s), 1 worker", fleetCase{channel: chAMQP, projections: 300, workers: 1}.label())
	require.Equal(t, "PostgreSQL queue, 10 projection(s), 4 workers", fleetCase{channel: chPostgres, projections: 300, workers: 4}.base().label())
}

func TestFleetPerEventProjection(t *testing.T) {
	t.Parallel()
	// 2 s of backend CPU over 1,000 events × 100 projections: 20 µs each.
	f := fleetFigures{pgCPU: 2 * time.Second, appended: 1000}
	require.InDelta(t, 20.0, f.perEventProjection(100), 1e-9)
	require.Zero(t, fleetFigures{pgCPU: time.Second}.perEventProjection(10), "no events: no figure, not infinity")
}

func TestParseStatCPU(t *testing.T) {
	t.Parallel()
	// A command with a space and a parenthesis; utime 407 and stime 33438 ticks.
	stat := "2248 (postgres: a) b) S 1 2248 2248 0 -1 4194304 118726 12137706 0 97 407 33438 16476 20 0 1 0 4335 222543872 7534"
	cpu, err := parseStatCPU([]byte(stat))
	require.NoError(t, err)
	require.Equal(t, (407+33438)*clockTick, cpu)
	_, err = parseStatCPU([]byte("12 (x) S 1 2"))
	require.ErrorContains(t, err, "fields after the command")
	_, err = parseStatCPU([]byte("no command"))
	require.Error(t, err)
}

func TestCPUGrowthCountsNewBackendsWhole(t *testing.T) {
	t.Parallel()
	before := map[int]time.Duration{1: time.Second, 2: 3 * time.Second, 9: time.Hour} // 9 ended
	now := map[int]time.Duration{1: 2 * time.Second, 2: 3 * time.Second, 5: 500 * time.Millisecond}
	require.Equal(t, 1500*time.Millisecond, cpuGrowth(before, now))
}

func TestSpreadDealsProjectionsRoundRobin(t *testing.T) {
	t.Parallel()
	require.Equal(t, [][]string{{"a", "e"}, {"b"}, {"c"}, {"d"}}, spread([]string{"a", "b", "c", "d", "e"}, 4))
	require.Equal(t, [][]string{{"a"}, {"b"}}, spread([]string{"a", "b"}, 4), "no worker without a projection")
}

func TestFleetMarginalCostPerAddedProjection(t *testing.T) {
	t.Parallel()
	// 1,500 µs per event with 1 projection, 11,400 with 100: 100 µs per added projection.
	require.InDelta(t, 100.0, marginal(1500, 11400, 100), 1e-9)
	require.Zero(t, marginal(1500, 1500, 1))
}

// TestMachineBusy: the machine's busy CPU grows while this process burns CPU, by at least what
// the process itself used.
func TestMachineBusy(t *testing.T) {
	start, proc := MachineBusy(), ProcessCPU()
	require.Positive(t, start, "/proc/stat's cpu line")
	x := 0
	for ProcessCPU()-proc < 100*time.Millisecond {
		for i := range 1_000_000 {
			x += i
		}
	}
	used := ProcessCPU() - proc
	grew := MachineBusy() - start
	// /proc/stat counts in ticks of 10 ms: allow one per core for the rounding.
	require.GreaterOrEqual(t, grew, used-20*time.Millisecond, "busy %s while this process used %s (x=%d)", grew, used, x)
}
