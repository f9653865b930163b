package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/projectiontest"
	"github.com/nudgeworks/nudge/worker"
)

// benchDuration is how long each live-latency scenario appends; NUDGE_BENCH_DURATION overrides.
func benchDuration(b *testing.B) time.Duration {
	if v := os.Getenv("NUDGE_BENCH_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(b, err)
		return d
	}
	return 10 * time.Second
}

// BenchmarkLiveLatency appends at a steady 1,000 events/s over 100 streams from 8 writers and
// measures, per event, the time from the append's commit to the end of the projection batch that
// handled it (just before that batch commits), with 1 and 10 projections on each channel. Each
// iteration is one whole scenario; run it with -benchtime 1x.
func BenchmarkLiveLatency(b *testing.B) {
	for _, name := range slices.Sorted(maps.Keys(channels)) {
		for _, projections := range []int{1, 10} {
			b.Run(fmt.Sprintf("channel=%s/projections=%d", name, projections), func(b *testing.B) {
				for range b.N {
					liveLatency(b, name, projections)
				}
			})
		}
	}
}

type latencies struct {
	mu        sync.Mutex
	committed map[int]time.Time            // event number → when its append returned
	handled   map[string]map[int]time.Time // projection → event number → first handled
}

func (l *latencies) handle(projectionName string, events []eventstore.Event) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range events {
		var p projectiontest.Payload
		if err := json.Unmarshal(e.Payload, &p); err != nil {
			panic(err)
		}
		if _, ok := l.handled[projectionName][p.N]; !ok {
			l.handled[projectionName][p.N] = now
		}
	}
}

func (l *latencies) complete() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, h := range l.handled {
		if len(h) < len(l.committed) {
			return false
		}
	}
	return true
}

func liveLatency(b *testing.B, channelName string, count int) {
	s := newSetup(b)
	ch := s.newChannel(b, channels[channelName])
	lat := &latencies{committed: map[int]time.Time{}, handled: map[string]map[int]time.Time{}}
	var ps []*projection.Projection
	for i := range count {
		name := fmt.Sprintf("p%02d", i)
		lat.handled[name] = map[int]time.Time{}
		p, err := projection.New(name, projection.Config{
			FlushFunc: func(_ context.Context, fp projection.FlushParams) error {
				lat.handle(fp.Projection, fp.Events)
				return nil
			},
		}, projection.OnAnyIdempotent(func(context.Context, eventstore.Event) error { return nil }))
		require.NoError(b, err)
		ps = append(ps, p)
	}
	s.start(b, ch, worker.Config{SafetyNetInterval: -1}, ps...)

	const writers, rate, streams = 8, 1000, 100
	duration := benchDuration(b)
	interval := time.Second * writers / rate
	deadline := time.Now().Add(duration)
	var wg sync.WaitGroup
	b.ResetTimer()
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for i := 0; time.Now().Before(deadline); i++ {
				<-tick.C
				n := w*10_000_000 + i
				s.append(b, fmt.Sprintf("stream-%d", n%streams), storeEvent(n))
				lat.mu.Lock()
				lat.committed[n] = time.Now()
				lat.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if !waitFor(lat.complete, time.Minute) {
		lat.mu.Lock()
		defer lat.mu.Unlock()
		for name, h := range lat.handled {
			b.Logf("%s handled %d of %d", name, len(h), len(lat.committed))
		}
		b.Fatal("not every projection handled every event within a minute")
	}
	b.StopTimer()

	lat.mu.Lock()
	defer lat.mu.Unlock()
	appended := len(lat.committed)
	var samples []time.Duration
	for _, h := range lat.handled {
		for n, at := range lat.committed {
			samples = append(samples, max(h[n].Sub(at), 0))
		}
	}
	slices.Sort(samples)
	pct := func(p float64) float64 {
		return float64(samples[int(p*float64(len(samples)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(float64(appended)/duration.Seconds(), "appends/s")
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(pct(1), "max-ms")
}

func waitFor(cond func() bool, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return cond()
}
