package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/relay"
)

// TestDeepEventTypesAreTheStatusScenarios: the types the deep scenario gives in Go are those
// statusTypesSQL's trigger gives by global position (i+1): the common four in turn, refunds
// every eighth event of the last tenth only.
func TestDeepEventTypesAreTheStatusScenarios(t *testing.T) {
	t.Parallel()
	typeOf := deepEventType(1000)
	require.Equal(t, statusTypePaid, typeOf(0))       // position 1: 1 % 4
	require.Equal(t, statusTypeRegistered, typeOf(3)) // position 4: 4 % 4
	require.Equal(t, statusTypeSeat, typeOf(6))       // position 7, before the last tenth
	require.Equal(t, statusTypeRefunded, typeOf(902)) // position 903: 903 % 8 = 7, past 900
	refunds := 0
	for i := range 1000 {
		if typeOf(i) == statusTypeRefunded {
			refunds++
			require.Greater(t, i+1, 900)
		}
	}
	require.Equal(t, 13, refunds) // 903, 911, …, 999
}

func TestParseDepths(t *testing.T) {
	t.Parallel()
	got, err := parseDepths(" 1000000, 20_000_000 ")
	require.NoError(t, err)
	require.Equal(t, []int{1_000_000, 20_000_000}, got)
	got, err = parseDepths("")
	require.NoError(t, err)
	require.Nil(t, got)
	for _, bad := range []string{"10", "1000,x", "1e6", ","} {
		_, err := parseDepths(bad)
		require.ErrorContains(t, err, "-deep-events", bad)
	}
	o, err := parseFlags([]string{"-scenario", "deep", "-deep-events", "5000,10000"}, &strings.Builder{})
	require.NoError(t, err)
	require.Equal(t, []int{5000, 10_000}, o.deepEvents)
	require.Equal(t, []string{"deep"}, o.scenarios)
	require.False(t, needsAMQP(o.scenarios), "the deep scenario needs no broker")
}

func TestDeepSpreadReachesTheHead(t *testing.T) {
	t.Parallel()
	gps := deepSpread(20_000_000, 300)
	require.Len(t, gps, 300)
	require.Equal(t, int64(66_666), gps[0])
	require.Equal(t, int64(20_000_000), gps[299])
	for i := 1; i < len(gps); i++ {
		require.Greater(t, gps[i], gps[i-1])
	}
}

// TestDeepRowsCompareEveryDepthWithTheFirst: each figure of a deeper store is reported beside
// the first depth's, measured in the same run.
func TestDeepRowsCompareEveryDepthWithTheFirst(t *testing.T) {
	t.Parallel()
	shallow := &deepResult{events: 1000, load: 2 * time.Second, size: deepSizes{table: 1000 * 300, total: 1000 * 600, pages: 10, allVisible: 10,
		indexes: []indexSize{{name: "nudge_events_pkey", bytes: 1000 * 20, levels: 2}}}}
	deep := &deepResult{events: 4000, load: 10 * time.Second, size: deepSizes{table: 4000 * 300, total: 4000 * 600, pages: 40, allVisible: 30,
		indexes: []indexSize{{name: "nudge_events_pkey", bytes: 4000 * 20, levels: 3}}}}
	sec := &Section{Params: map[string]any{}}
	reportDeep(sec, []*deepResult{shallow, deep})
	byCase := map[string]Metric{}
	for _, m := range sec.Metrics {
		byCase[m.Case+"/"+m.Name] = m
	}
	load := byCase["COPY load (with the streams table and ANALYZE), 4,000 events/events_per_s"]
	require.InDelta(t, 400.0, load.Value, 1e-9)
	require.Equal(t, "COPY load (with the streams table and ANALYZE), 1,000 events", load.Baseline)
	require.InDelta(t, 0.8, load.Ratio, 1e-9)
	levels := byCase["index nudge_events_pkey, 4,000 events/btree_levels"]
	require.InDelta(t, 3.0, levels.Value, 1e-9)
	require.InDelta(t, 1.5, levels.Ratio, 1e-9)
	require.InDelta(t, 20.0, byCase["index nudge_events_pkey, 4,000 events/bytes_per_event"].Value, 1e-9)
	require.InDelta(t, 75.0, byCase["all-visible pages after VACUUM, 4,000 events/share"].Value, 1e-9)
	require.Empty(t, byCase["COPY load (with the streams table and ANALYZE), 1,000 events/seconds"].Baseline, "the first depth is the baseline")
	require.Contains(t, strings.Join(sec.Notes, "\n"), "estimate, 500,000,000 events")
}

// TestDeepScenarioRunsAtSmallDepths runs the scenario over two small stores against the real
// server: every figure is measured at both depths and the databases are dropped.
func TestDeepScenarioRunsAtSmallDepths(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	log := testlog.New(t)
	h, err := newHarness(ctx, options{quick: true, postgresURL: pgtest.URL(), relayInterval: relay.MinIntervalDefault}, log, log)
	require.NoError(t, err)
	t.Cleanup(h.close)
	h.sizes.deepEvents, h.sizes.deepCatchUp, h.sizes.deepAppends, h.sizes.deepWarmAppends = []int{3000, 6000}, 1000, 20, 5
	h.sizes.deepLive, h.sizes.statusRuns = 300*time.Millisecond, statusMinRuns
	sec := &Section{Params: map[string]any{}}
	require.NoError(t, runDeep(ctx, h, sec))
	values := map[string]float64{}
	for _, m := range sec.Metrics {
		values[m.Case+"/"+m.Name] = m.Value
	}
	for _, depth := range []string{"3,000", "6,000"} {
		for _, figure := range []string{
			"catch-up from zero, the first events, %s events/events_per_s",
			"catch-up near the end, the last events to the head, %s events/events_per_s",
			"append, 1 event/tx, one writer, %s events/p99_ms",
			"Backend.Statuses, 300 projections, after VACUUM, %s events/median_ms",
			"live at the head: handled (first append to the last handled), %s events/events_per_s",
			"index nudge_events_read_order_idx, %s events/btree_levels",
			"nudge_events with its indexes, %s events/bytes_per_event",
		} {
			key := strings.Replace(figure, "%s", depth, 1)
			require.Positive(t, values[key], key)
		}
	}
	var left int
	require.NoError(t, h.admin.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname LIKE $1`, dbPrefix+h.runID+"%").Scan(&left))
	require.Zero(t, left, "every depth's database is dropped")
}
