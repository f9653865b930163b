package backoff_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/backoff"
)

func TestDelay(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	require.Zero(t, backoff.Delay(ms, 10*ms, 2, 0, 0, 0.5))
	require.Equal(t, ms, backoff.Delay(ms, 10*ms, 2, 0, 1, 0.5))
	require.Equal(t, 8*ms, backoff.Delay(ms, 10*ms, 2, 0, 4, 0.9), "no jitter: random is ignored")
	require.Equal(t, 10*ms, backoff.Delay(ms, 10*ms, 2, 0, 5, 0.5), "capped")
	require.Equal(t, 10*ms, backoff.Delay(ms, 10*ms, 2, 0, 5000, 0.5), "capped, also where the power overflows")
	require.Equal(t, 80*time.Microsecond*10, backoff.Delay(ms, 10*ms, 2, 0.2, 1, 0), "random 0: −jitter")
	require.Equal(t, 1200*time.Microsecond, backoff.Delay(ms, 10*ms, 2, 0.2, 1, math.Nextafter(1, 0)).Round(time.Microsecond), "random near 1: +jitter")
	require.Equal(t, ms, backoff.Delay(ms, 10*ms, 2, -1, 1, 0), "a negative jitter is none")
}

func TestExponential(t *testing.T) {
	t.Parallel()
	b := backoff.Exponential{Initial: 2 * time.Millisecond, Max: 10 * time.Millisecond}
	var got []time.Duration
	for range 5 {
		got = append(got, b.Next())
	}
	require.Equal(t, []time.Duration{2, 4, 8, 10, 10}, msOf(got))
	b.Reset()
	require.Equal(t, 2*time.Millisecond, b.Next())

	jittered := backoff.Exponential{Initial: 100 * time.Millisecond, Max: time.Second, Jitter: 0.5}
	for range 100 {
		d := jittered.Next()
		jittered.Reset()
		require.GreaterOrEqual(t, d, 50*time.Millisecond)
		require.LessOrEqual(t, d, 150*time.Millisecond)
	}
}

func TestSleep(t *testing.T) {
	t.Parallel()
	require.NoError(t, backoff.Sleep(context.Background(), time.Microsecond))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, backoff.Sleep(ctx, time.Hour), context.Canceled)
	require.ErrorIs(t, backoff.Sleep(ctx, 0), context.Canceled)
}

func msOf(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d / time.Millisecond
	}
	return out
}
