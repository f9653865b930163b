package postgres

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	eventpg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/trigger"
)

// benchEventsPerAppend is how many events each benchmarked append writes.
const benchEventsPerAppend = 10

// BenchmarkAppend measures what publishing the trigger in the append's transaction costs: an
// append of benchEventsPerAppend events per transaction alone ("plain"), and with PublishTx of
// its trigger fanned out to 1 and 10 declared projections. No consumer runs, so trigger rows
// accumulate as they would behind a stopped worker.
func BenchmarkAppend(b *testing.B) {
	for _, bc := range []struct {
		name        string
		projections int
	}{{"plain", 0}, {"publish/projections=1", 1}, {"publish/projections=10", 10}} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			db := pgtest.New(b)
			store, err := eventpg.New(db.Pool, eventpg.Config{})
			require.NoError(b, err)
			require.NoError(b, store.Migrate(ctx))
			ch, err := New(db.Pool, Config{})
			require.NoError(b, err)
			b.Cleanup(func() { require.NoError(b, ch.Close()) })
			require.NoError(b, ch.Migrate(ctx))
			for i := range bc.projections {
				require.NoError(b, ch.Declare(ctx, fmt.Sprintf("projection-%d", i)))
			}
			events := make([]eventstore.EventData, benchEventsPerAppend)
			for i := range events {
				events[i] = eventstore.EventData{Type: "TicketWasRegistered", Payload: []byte(`{"ticket":"T-1","title":"printer on fire"}`)}
			}
			i := 0
			for b.Loop() {
				i++
				err := store.RunInTx(ctx, func(tx pgx.Tx) error {
					res, err := store.AppendTx(ctx, tx, "ticket-"+strconv.Itoa(i), eventstore.NoStream, events...)
					if err != nil || bc.projections == 0 {
						return err
					}
					return ch.PublishTx(ctx, tx, trigger.ForAppend(res, time.Now()))
				})
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPublishToConsume measures the latency from Publish to a subscription receiving the
// trigger, at paced publish rates, for the default poll interval and two others. Each op is one
// trigger; ns/op is only the pacing.
func BenchmarkPublishToConsume(b *testing.B) {
	for _, poll := range []time.Duration{10 * time.Millisecond, PollIntervalDefault, time.Second} {
		for _, rate := range []int{20, 500} {
			b.Run(fmt.Sprintf("poll=%v/rate=%d/s", poll, rate), func(b *testing.B) {
				benchLatency(b, poll, time.Second/time.Duration(rate))
			})
		}
	}
}

func benchLatency(b *testing.B, poll, every time.Duration) {
	ctx := context.Background()
	db := pgtest.New(b)
	ch, err := New(db.Pool, Config{PollInterval: poll})
	require.NoError(b, err)
	b.Cleanup(func() { require.NoError(b, ch.Close()) })
	require.NoError(b, ch.Declare(ctx, "bench"))
	sub, topic, err := ch.Subscriber("bench")
	require.NoError(b, err)
	subCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs, err := sub.Subscribe(subCtx, topic)
	require.NoError(b, err)

	n := b.N
	latencies := make(chan time.Duration, n)
	go func() {
		for msg := range msgs {
			t, err := trigger.FromMessage(msg)
			if err == nil {
				latencies <- time.Since(t.At)
			}
			msg.Ack()
		}
	}()
	b.ResetTimer()
	start := time.Now()
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(i) * every))) // pacing, not a condition
		if err := ch.Publish(ctx, trigger.Trigger{At: time.Now(), Reason: trigger.ReasonAppend}); err != nil {
			b.Fatal(err)
		}
	}
	got := make([]time.Duration, 0, n)
	timeout := time.After(poll + 30*time.Second)
	for len(got) < n {
		select {
		case l := <-latencies:
			got = append(got, l)
		case <-timeout:
			b.Fatalf("received %d of %d triggers", len(got), n)
		}
	}
	b.StopTimer()
	slices.Sort(got)
	ms := func(q float64) float64 { return float64(got[int(q*float64(len(got)-1))]) / float64(time.Millisecond) }
	b.ReportMetric(ms(0.5), "p50-ms")
	b.ReportMetric(ms(0.99), "p99-ms")
}

// countingDB counts the transactions the subscriptions begin: one per poll.
type countingDB struct {
	*pgxpool.Pool
	begins atomic.Int64
}

func (c *countingDB) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	c.begins.Add(1)
	return c.Pool.BeginTx(ctx, opts)
}

// BenchmarkIdlePolling measures what idle subscriptions cost: each op is one second with
// nothing to deliver. It reports polls per second (each is BEGIN, SELECT, COMMIT) and the CPU
// the subscriptions use, as a percentage of one core, in this process and in the PostgreSQL
// backends (read from /proc, so only when the server runs on this host).
func BenchmarkIdlePolling(b *testing.B) {
	for _, poll := range []time.Duration{10 * time.Millisecond, 50 * time.Millisecond, PollIntervalDefault, time.Second} {
		for _, subs := range []int{1, 10} {
			b.Run(fmt.Sprintf("poll=%v/subscriptions=%d", poll, subs), func(b *testing.B) {
				benchIdle(b, poll, subs)
			})
		}
	}
}

func benchIdle(b *testing.B, poll time.Duration, subs int) {
	ctx := context.Background()
	db := pgtest.New(b)
	counting := &countingDB{Pool: db.NewPool(b, int32(subs+2))}
	ch, err := New(counting, Config{PollInterval: poll})
	require.NoError(b, err)
	b.Cleanup(func() { require.NoError(b, ch.Close()) })
	subCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i := range subs {
		name := fmt.Sprintf("idle-%d", i)
		require.NoError(b, ch.Declare(ctx, name))
		sub, topic, err := ch.Subscriber(name)
		require.NoError(b, err)
		_, err = sub.Subscribe(subCtx, topic)
		require.NoError(b, err)
	}
	time.Sleep(poll + 200*time.Millisecond) // let every subscription open its connection

	pgBefore, pgOK := backendCPU(b, db.Pool)
	goBefore := processCPU()
	beginsBefore := counting.begins.Load()
	start := time.Now()
	b.ResetTimer()
	for b.Loop() {
		time.Sleep(time.Second) // idleness is what is measured
	}
	b.StopTimer()
	wall := time.Since(start)
	b.ReportMetric(float64(counting.begins.Load()-beginsBefore)/wall.Seconds(), "polls/s")
	b.ReportMetric(100*float64(processCPU()-goBefore)/float64(wall), "go-cpu-%")
	if pgAfter, ok := backendCPU(b, db.Pool); ok && pgOK {
		b.ReportMetric(100*float64(pgAfter-pgBefore)/float64(wall), "pg-cpu-%")
	}
}

// processCPU is this process's user and system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// backendCPU sums the CPU time of the PostgreSQL backends connected to db's database, from
// /proc (false when the server is not on this host).
func backendCPU(b *testing.B, db *pgxpool.Pool) (time.Duration, bool) {
	b.Helper()
	rows, err := db.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	require.NoError(b, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(b, err)
	const ticksPerSecond = 100 // Linux USER_HZ
	var total time.Duration
	for _, pid := range pids {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, false
		}
		_, rest, _ := strings.Cut(string(stat), ") ")
		fields := strings.Fields(rest) // fields[0] is the state, field 3 of the file
		if len(fields) < 13 {
			return 0, false
		}
		utime, _ := strconv.ParseInt(fields[11], 10, 64)
		stime, _ := strconv.ParseInt(fields[12], 10, 64)
		total += time.Duration(utime+stime) * time.Second / ticksPerSecond
	}
	return total, true
}
