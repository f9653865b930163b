package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/chaos/chaosmodel"
)

// appender is the part of the event store the writers use.
type appender interface {
	Append(ctx context.Context, streamID string, expected eventstore.ExpectedVersion, events ...eventstore.EventData) (eventstore.AppendResult, error)
}

// load is the scenario's writers: each appends small batches of events to streams of its own
// at a steady pace, and retries a failed append with the same event ids (the store treats an
// exact repeat as idempotent) until it is committed, so a write whose outcome was lost in an
// outage is neither lost nor doubled.
type load struct {
	store   appender
	log     *slog.Logger
	writers int
	// pause between two appends of one writer; zero appends flat out.
	pause time.Duration
	// perAppend is the most events per append (1 to perAppend, random).
	perAppend int
	// keepRate makes a writer that fell behind its share of the rate (its appends took longer
	// than the pause) append the events it owes in its next appends, up to keepRateMax each,
	// instead of losing the missed ticks; perWriter is that share, in events a second.
	keepRate  bool
	perWriter float64
	seed      uint64

	mu      sync.Mutex
	acked   []uuid.UUID // events of appends that returned success
	retries atomic.Int64
	failed  atomic.Bool // a writer stopped on an error that retrying cannot fix
	poison  atomic.Pointer[uuid.UUID]

	stop    chan struct{}
	wg      sync.WaitGroup
	seq     []int
	stopped bool
}

// perAppendDefault is the most events per append unless a scenario says otherwise.
const perAppendDefault = 3

// keepRateMax bounds the appends of a writer that catches up with its rate (load.keepRate).
const keepRateMax = 50

// newLoad returns writers appending about rate events a second in all, 1 to perAppend events
// per append (perAppendDefault for 0).
func newLoad(store appender, log *slog.Logger, writers, rate, perAppend int, seed uint64) *load {
	perAppend = cmp.Or(perAppend, perAppendDefault)
	l := &load{store: store, log: log, writers: writers, perAppend: perAppend, seed: seed, seq: make([]int, writers)}
	if rate > 0 {
		l.perWriter = float64(rate) / float64(writers)
		appendsPerWriter := float64(rate) / float64(writers) / (float64(1+perAppend) / 2)
		l.pause = time.Duration(float64(time.Second) / appendsPerWriter)
	}
	return l
}

// start starts the writers; they run until stopWriters or ctx ends.
func (l *load) start(ctx context.Context) {
	l.stop = make(chan struct{})
	l.stopped = false
	for w := range l.writers {
		l.wg.Go(func() { l.write(ctx, w, l.stop) })
	}
}

// stopWriters stops the writers after their append in flight and waits for them.
func (l *load) stopWriters() {
	if l.stop != nil && !l.stopped {
		close(l.stop)
		l.stopped = true
	}
	l.wg.Wait()
}

// backlog appends n events flat out with every writer and returns when they are committed.
func (l *load) backlog(ctx context.Context, n int) error {
	var wg sync.WaitGroup
	errs := make([]error, l.writers)
	for w := range l.writers {
		share := n / l.writers
		if w == 0 {
			share += n % l.writers
		}
		wg.Go(func() {
			for share > 0 {
				k := min(share, 50)
				if err := l.appendBatch(ctx, w, k, false); err != nil {
					errs[w] = err
					return
				}
				share -= k
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (l *load) write(ctx context.Context, w int, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(l.seed, uint64(w)+1))
	var tick <-chan time.Time
	if l.pause > 0 {
		// Start the writers apart, so their appends spread over the interval.
		select {
		case <-time.After(time.Duration(rng.Int64N(int64(l.pause)))):
		case <-stop:
			return
		case <-ctx.Done():
			return
		}
		ticker := time.NewTicker(l.pause)
		defer ticker.Stop()
		tick = ticker.C
	}
	began, written := time.Now(), 0
	for {
		k := 1 + rng.IntN(l.perAppend)
		if l.keepRate && l.perWriter > 0 {
			owed := int(time.Since(began).Seconds()*l.perWriter) - written
			k = max(k, min(owed, keepRateMax))
		}
		written += k
		if err := l.appendBatch(ctx, w, k, false); err != nil {
			if ctx.Err() == nil {
				l.failed.Store(true)
				l.log.Error("writer stopped", slog.Int("writer", w), slog.Any("error", err))
			}
			return
		}
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-tick:
		}
	}
}

// appendPoison appends one poison event with writer 0's streams and returns its id.
func (l *load) appendPoison(ctx context.Context) (uuid.UUID, error) {
	if err := l.appendBatch(ctx, l.writers, 1, true); err != nil {
		return uuid.Nil, err
	}
	return *l.poison.Load(), nil
}

// appendBatch appends k events for writer w and retries until they are committed or ctx ends.
func (l *load) appendBatch(ctx context.Context, w, k int, poison bool) error {
	l.mu.Lock()
	if w >= len(l.seq) {
		l.seq = append(l.seq, make([]int, w+1-len(l.seq))...)
	}
	first := l.seq[w]
	l.seq[w] += k
	l.mu.Unlock()
	stream := fmt.Sprintf("chaos-w%d-s%d", w, first%16)
	events := make([]eventstore.EventData, k)
	ids := make([]uuid.UUID, k)
	for i := range events {
		payload, err := json.Marshal(chaosmodel.Payload{Writer: w, Seq: first + i, Poison: poison})
		if err != nil {
			return err
		}
		ids[i] = uuid.Must(uuid.NewV7())
		events[i] = eventstore.EventData{ID: ids[i], Type: chaosmodel.EventType, Payload: payload}
	}
	wait := 20 * time.Millisecond
	for attempt := 1; ; attempt++ {
		_, err := l.store.Append(ctx, stream, eventstore.Any, events...)
		if err == nil {
			l.mu.Lock()
			l.acked = append(l.acked, ids...)
			l.mu.Unlock()
			if poison {
				l.poison.Store(&ids[0])
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, eventstore.ErrInvalidInput) || errors.Is(err, eventstore.ErrDuplicateEvent) {
			return fmt.Errorf("writer %d: %w", w, err) // retrying cannot help
		}
		l.retries.Add(1)
		if attempt == 1 || attempt%20 == 0 {
			l.log.Debug("append failed; retrying with the same event ids", slog.Int("writer", w), slog.Int("attempt", attempt), slog.Any("error", err))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

// ackedIDs returns the ids of every event whose append returned success.
func (l *load) ackedIDs() []uuid.UUID {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]uuid.UUID(nil), l.acked...)
}

// ackedCount is len(ackedIDs()).
func (l *load) ackedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}
