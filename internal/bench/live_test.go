package main

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection"
)

// TestLiveRecorderAwaitsTheWarmUpButMeasuresOnlyTheWindow: a live run is complete only once
// every warm-up event is visible too, and its samples are those of the measured events alone.
func TestLiveRecorderAwaitsTheWarmUpButMeasuresOnlyTheWindow(t *testing.T) {
	t.Parallel()
	rec := newLiveRecorder([]string{"p"})
	start := time.Now()
	warm, measured := uuid.New(), uuid.New()
	rec.warmedUp(warm, start)
	rec.appended(measured, start.Add(time.Hour)) // after its batch: a sample of 0

	rec.flush("p", []eventstore.Event{{ID: measured}})
	rec.onBatch(projection.BatchReport{Projection: "p"})
	require.False(t, rec.complete(), "the warm-up event is not visible yet")

	rec.flush("p", []eventstore.Event{{ID: warm}})
	rec.onBatch(projection.BatchReport{Projection: "p"})
	require.True(t, rec.complete())
	require.Equal(t, []time.Duration{0}, rec.samples(), "only the measured event is a sample")
}
