package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/projection"
)

func TestLagDifferencesFlagAProjectionReportedCaughtUp(t *testing.T) {
	t.Parallel()
	exact := map[string]int64{"status_00": 1000, "status_04": 200, "status_08": 50}
	m := &statusMeasure{short: "Statuses", last: lagReading{
		lag:       map[string]int64{"status_00": 1000, "status_04": 205, "status_08": 0},
		estimated: map[string]bool{"status_00": true, "status_04": true, "status_08": true},
		condition: map[string]projection.Condition{"status_08": projection.ConditionCaughtUp},
	}}
	match, estimated := lagAgreement(m.last, exact)
	require.Equal(t, 1, match)
	require.Equal(t, 3, estimated)
	require.Equal(t, []string{
		"Statuses: status_08 (types TicketWasRefunded) lags 0 events, exact 50 (-100%): reported caught up while behind (Condition caught_up)",
		"Statuses: status_04 (types SeatWasReserved) lags 205 events, exact 200 (+2%)",
	}, lagDifferences(m, exact))
}

func TestMedianMsTakesTheUpperMiddle(t *testing.T) {
	t.Parallel()
	require.InDelta(t, 3.0, medianMs([]time.Duration{4 * time.Millisecond, time.Millisecond, 3 * time.Millisecond}), 1e-9)
	require.InDelta(t, 3.0, medianMs([]time.Duration{4 * time.Millisecond, time.Millisecond, 3 * time.Millisecond, 2 * time.Millisecond}), 1e-9)
	require.Zero(t, medianMs(nil))
	require.InDelta(t, 2.0, median([]float64{3, 1, 2}), 1e-9)
	require.Zero(t, median(nil))
}

func TestStatusTypesCoverEveryProjection(t *testing.T) {
	t.Parallel()
	sql := statusTypesSQL(1_000_000)
	require.Contains(t, sql, "NEW.global_position > 900000 AND NEW.global_position % 8 = 7 THEN 'TicketWasRefunded'")
	for _, types := range statusProjections {
		for _, ty := range types {
			require.Contains(t, sql, "'"+ty+"'")
		}
	}
	require.Equal(t, "any", typesOf("status_00"))
	require.Equal(t, "TicketWasPaid,TicketWasCancelled", typesOf("status_02"))
	require.Equal(t, "?", typesOf("other"))
}
