package worker_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/projectiontest"
)

// effects counts the side effects of the events (by stream and version) that versions of a
// projection handled live, not as history.
type effects struct {
	mu    sync.Mutex
	times map[string]int
}

func (f *effects) add(stream string, version int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.times[fmt.Sprintf("%s/%d", stream, version)]++
}

// versionedStreams is version version of the projection "bgp", split into partitions: a row
// per stream version in bgp_streams_v<version>, read through the view bgp_streams. It refuses
// a stream version whose predecessor it has not applied (every stream in order), and records
// the events it handles live in fx.
func versionedStreams(t testing.TB, version, partitions int, fx *effects) *projection.Projection {
	t.Helper()
	var p *projection.Projection
	p, err := projection.New("bgp", projection.Config{
		Version:    version,
		Partitions: partitions,
		BatchSize:  20,
		Tables:     []string{"bgp_streams"},
		InitFunc: func(ctx context.Context, hp projection.HookParams) error {
			_, err := hp.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+p.Table("bgp_streams")+` (stream text, version int, times int NOT NULL, PRIMARY KEY (stream, version))`)
			return err
		},
	}, projection.On("A", func(ctx context.Context, tx pgx.Tx, e projection.Event[projectiontest.Payload]) error {
		table := p.Table("bgp_streams")
		if e.StreamVersion > 1 {
			var ok bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+table+` WHERE stream = $1 AND version = $2)`, e.StreamID, e.StreamVersion-1).Scan(&ok); err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("stream %s: version %d before %d", e.StreamID, e.StreamVersion, e.StreamVersion-1)
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1, $2, 1) ON CONFLICT (stream, version) DO UPDATE SET times = `+table+`.times + 1`,
			e.StreamID, e.StreamVersion); err != nil {
			return err
		}
		if !e.Replay {
			fx.add(e.StreamID, e.StreamVersion) // after the commit in a real sink; here the batch commits
		}
		return nil
	}))
	require.NoError(t, err)
	return p
}

// TestPartitionedBlueGreen: a rolling deploy changes a partitioned projection's shape and its
// partition count. Worker w1 runs version 1 (4 partitions) while writers append; worker w2,
// the new deployment, knows only version 2 (8 partitions): it builds version 2 beside version
// 1 from its own partitions' leases and triggers, and cuts over by itself. A reader of the
// view meanwhile never sees the model shrink, a stream with a gap, or a row applied twice;
// afterwards every event is in the model once and had its side effect once (in one version
// or the other), and version 1 is retired. On every channel.
func TestPartitionedBlueGreen(t *testing.T) {
	eachChannel(t, func(t *testing.T, s *setup, ch channel.Channel) {
		ctx := context.Background()
		const streams = 24
		fx := &effects{times: map[string]int{}}
		w1, stop1 := s.startStoppable(t, ch, s.leased("w1"), versionedStreams(t, 1, 4, fx))
		t.Cleanup(func() { stop1(); require.NoError(t, ch.Close()) })
		require.Eventually(t, func() bool { return len(w1.Owned("bgp")) == 4 }, eventually, 10*time.Millisecond)

		view := func(q *int, twice, gaps *int) error {
			return s.db.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE times <> 1),
				count(*) FILTER (WHERE version > 1 AND NOT EXISTS (SELECT FROM bgp_streams p WHERE p.stream = b.stream AND p.version = b.version - 1))
				FROM bgp_streams b`).Scan(q, twice, gaps)
		}
		activeVersion := func() (v int) {
			require.NoError(t, s.db.Pool.QueryRow(ctx, `SELECT version FROM nudge_projection_versions WHERE projection = 'bgp' AND state = 'active'`).Scan(&v))
			return v
		}

		var (
			readerDone = make(chan struct{})
			stopReader atomic.Bool
			reads      atomic.Int64
		)
		go func() { // the reader: answers through the stable name, during the whole build and flip
			defer close(readerDone)
			seen := 0
			for !stopReader.Load() {
				var rows, twice, gaps int
				if err := view(&rows, &twice, &gaps); err != nil {
					t.Errorf("read the view: %v", err)
					return
				}
				reads.Add(1)
				if rows < seen || twice != 0 || gaps != 0 {
					t.Errorf("the view showed %d rows (%d before), %d applied twice, %d streams with a gap", rows, seen, twice, gaps)
					return
				}
				seen = rows
			}
		}()

		rounds := 0
		for ; rounds < 2; rounds++ {
			s.appendStreams(t, streams, rounds*streams)
		}
		w2, stop2 := s.startStoppable(t, s.secondChannel(t, ch), s.leased("w2"), versionedStreams(t, 2, 8, fx))
		t.Cleanup(stop2)
		require.Eventually(t, func() bool { return len(w2.Owned("bgp.v2")) == 8 }, eventually, 10*time.Millisecond)
		// Writers go on while version 2 builds, until a few rounds after the flip.
		deadline := time.Now().Add(eventually)
		for after := 0; after < 3; rounds++ {
			s.appendStreams(t, streams, rounds*streams)
			if activeVersion() == 2 {
				after++
			}
			require.True(t, time.Now().Before(deadline), "version 2 did not take over within %s", eventually)
		}
		total := rounds * streams
		require.Eventually(t, func() bool {
			var rows, twice, gaps int
			require.NoError(t, view(&rows, &twice, &gaps))
			return rows == total
		}, eventually, 10*time.Millisecond, "version 2 has every event")
		stopReader.Store(true)
		<-readerDone
		require.Positive(t, reads.Load())

		var v2rows int
		require.NoError(t, s.db.Pool.QueryRow(ctx, `SELECT count(*) FROM bgp_streams_v2`).Scan(&v2rows))
		require.Equal(t, total, v2rows, "the view is version 2's table")
		fx.mu.Lock()
		require.Len(t, fx.times, total, "every event had its side effect")
		for key, n := range fx.times {
			require.Equal(t, 1, n, "event %s had its side effect once", key)
		}
		fx.mu.Unlock()
		st, err := s.runner.Status(ctx, "bgp.v2")
		require.NoError(t, err)
		require.Equal(t, projection.VersionActive, st.VersionState)
		require.Len(t, st.Partitions, 8)
	})
}
