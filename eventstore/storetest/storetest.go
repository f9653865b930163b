// Package storetest is the conformance suite every eventstore.Store implementation passes.
//
// Call Run from a test of the implementation's package with a function that returns a new,
// empty store with the given limits for each subtest.
package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// NewStoreFunc returns a new, empty store for one subtest that applies limits to appends (zero
// fields: the defaults).
type NewStoreFunc func(t *testing.T, limits eventstore.Limits) eventstore.Store

// Run runs the conformance suite against stores made by newStore. Subtests run in parallel.
func Run(t *testing.T, newStore NewStoreFunc) {
	tests := []struct {
		name string
		run  func(t *testing.T, s eventstore.Store)
	}{
		{"AppendReadRoundTrip", testRoundTrip},
		{"ExpectedVersion", testExpectedVersion},
		{"Idempotency", testIdempotency},
		{"TypeFilter", testTypeFilter},
		{"Empty", testEmpty},
		{"Limits", testLimits},
		{"PositionsIncrease", testPositionsIncrease},
		{"Head", testHead},
		{"BadInput", testBadInput},
		{"TooLarge", testTooLarge},
		{"ConcurrentAppendsToOneStream", testConcurrentAppends},
		{"ResultsAreCopies", testResultsAreCopies},
		{"Partitions", testPartitions},
		{"BadPartition", testBadPartition},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, newStore(t, eventstore.Limits{}))
		})
	}
	t.Run("TooLargeCustomLimits", func(t *testing.T) {
		t.Parallel()
		testTooLargeCustom(t, newStore(t, eventstore.Limits{MaxEventBytes: 100, MaxAppendBytes: 150, MaxAppendEvents: 3}))
	})
}

// Event returns EventData of type typ with a small JSON payload holding n.
func Event(typ string, n int) eventstore.EventData {
	return eventstore.EventData{Type: typ, Payload: json.RawMessage(fmt.Sprintf(`{"n": %d}`, n))}
}

// Settle waits until Read can return everything up to p: in the PostgreSQL store a transaction
// still running anywhere in the cluster (another test's, say) holds readers back for a while.
func Settle(t testing.TB, s eventstore.Store, p eventstore.Position) {
	t.Helper()
	var head eventstore.Position
	require.Eventually(t, func() bool {
		var err error
		head, err = s.Head(context.Background())
		require.NoError(t, err)
		return !head.Less(p)
	}, testwait.For(2*time.Minute), 2*time.Millisecond, "the store's head stayed at %s, before %s", head, p)
}

// ReadAll reads the whole store from the start in pages of limit.
func ReadAll(t testing.TB, s eventstore.Store, opts eventstore.ReadOptions) []eventstore.Event {
	t.Helper()
	var all []eventstore.Event
	var after eventstore.Position
	for {
		page, err := s.Read(context.Background(), after, opts)
		require.NoError(t, err)
		if len(page) == 0 {
			return all
		}
		all = append(all, page...)
		after = page[len(page)-1].Position
	}
}

func testRoundTrip(t *testing.T, s eventstore.Store) {
	ctx := context.Background()
	id := uuid.New()
	in := []eventstore.EventData{
		{ID: id, Type: "TicketWasRegistered", Payload: json.RawMessage(`{"ticket": "t-1", "price": 12.5}`), Metadata: json.RawMessage(`{"actor": "ann"}`)},
		{Type: "TicketWasClosed", Payload: json.RawMessage(`{"ticket": "t-1"}`)},
		{Type: "TicketWasClosed", Payload: json.RawMessage(`null`)},
	}
	res, err := s.Append(ctx, "ticket-1", eventstore.NoStream, in...)
	require.NoError(t, err)
	require.False(t, res.Idempotent)
	require.Len(t, res.Events, 3)
	require.Equal(t, int64(3), res.StreamVersion)
	require.Equal(t, id, res.Events[0].ID, "a given id is kept")
	require.NotEqual(t, uuid.Nil, res.Events[1].ID, "a missing id is assigned")
	require.Equal(t, []string{"TicketWasRegistered", "TicketWasClosed"}, res.Types())
	require.Equal(t, res.Events[2].Position, res.Last())

	Settle(t, s, res.Last())
	read := ReadAll(t, s, eventstore.ReadOptions{})
	require.Len(t, read, 3)
	stream, err := s.ReadStream(ctx, "ticket-1", 0, 0)
	require.NoError(t, err)
	require.Len(t, stream, 3)
	for i, e := range read {
		assert.Equal(t, res.Events[i].ID, e.ID)
		assert.Equal(t, "ticket-1", e.StreamID)
		assert.Equal(t, int64(i+1), e.StreamVersion)
		assert.Equal(t, in[i].Type, e.Type)
		assert.JSONEq(t, string(in[i].Payload), string(e.Payload))
		if in[i].Metadata == nil {
			assert.Nil(t, e.Metadata)
		} else {
			assert.JSONEq(t, string(in[i].Metadata), string(e.Metadata))
		}
		assert.False(t, e.RecordedAt.IsZero())
		assert.Equal(t, res.Events[i].Position, e.Position, "the append reports the positions reads see")
		assert.Equal(t, e, stream[i], "Read and ReadStream return the same event")
	}

	type ticket struct {
		Ticket string  `json:"ticket"`
		Price  float64 `json:"price"`
	}
	data, err := eventstore.NewEventData("TicketWasRegistered", ticket{Ticket: "t-2", Price: 3})
	require.NoError(t, err)
	_, err = s.Append(ctx, "ticket-2", eventstore.Any, data)
	require.NoError(t, err)
	got, err := s.ReadStream(ctx, "ticket-2", 0, 0)
	require.NoError(t, err)
	var decoded ticket
	require.NoError(t, json.Unmarshal(got[0].Payload, &decoded))
	require.Equal(t, ticket{Ticket: "t-2", Price: 3}, decoded)
}

func testExpectedVersion(t *testing.T, s eventstore.Store) {
	ctx := context.Background()
	wrong := func(err error, actual int64) {
		t.Helper()
		require.ErrorIs(t, err, eventstore.ErrWrongExpectedVersion)
		var wev *eventstore.WrongExpectedVersionError
		require.ErrorAs(t, err, &wev)
		require.Equal(t, "s", wev.StreamID)
		require.Equal(t, actual, wev.Actual)
		require.Contains(t, err.Error(), `stream "s" is at version`)
	}

	_, err := s.Append(ctx, "s", eventstore.Exact(2), Event("A", 1))
	wrong(err, 0)
	_, err = s.Append(ctx, "s", eventstore.Exact(0), Event("A", 1))
	require.NoError(t, err, "Exact(0) on a new stream")
	_, err = s.Append(ctx, "s", eventstore.NoStream, Event("A", 2))
	wrong(err, 1)
	_, err = s.Append(ctx, "s", eventstore.Exact(1), Event("A", 2), Event("A", 3))
	require.NoError(t, err)
	_, err = s.Append(ctx, "s", eventstore.Exact(1), Event("A", 4))
	wrong(err, 3)
	_, err = s.Append(ctx, "s", eventstore.Exact(4), Event("A", 4))
	wrong(err, 3)
	res, err := s.Append(ctx, "s", eventstore.Any, Event("A", 4))
	require.NoError(t, err)
	require.Equal(t, int64(4), res.StreamVersion)
	_, err = s.Append(ctx, "other", eventstore.NoStream, Event("A", 1))
	require.NoError(t, err)

	_, err = s.Append(ctx, "s", eventstore.Exact(-1), Event("A", 5))
	require.ErrorIs(t, err, eventstore.ErrInvalidInput)

	events, err := s.ReadStream(ctx, "s", 0, 0)
	require.NoError(t, err)
	require.Len(t, events, 4, "refused appends wrote nothing")
	for i, e := range events {
		require.JSONEq(t, fmt.Sprintf(`{"n": %d}`, i+1), string(e.Payload))
	}
}

func testIdempotency(t *testing.T, s eventstore.Store) {
	ctx := context.Background()
	a, b, c := uuid.New(), uuid.New(), uuid.New()
	batch := []eventstore.EventData{Event("A", 1), Event("B", 2)}
	batch[0].ID, batch[1].ID = a, b

	first, err := s.Append(ctx, "s", eventstore.NoStream, batch...)
	require.NoError(t, err)
	again, err := s.Append(ctx, "s", eventstore.NoStream, batch...)
	require.NoError(t, err, "an exact repeat succeeds, even with a stale expected version")
	require.True(t, again.Idempotent)
	require.Equal(t, first.StreamVersion, again.StreamVersion)
	require.Len(t, again.Events, 2)
	for i := range first.Events {
		require.Equal(t, first.Events[i].ID, again.Events[i].ID)
		require.Equal(t, first.Events[i].Position, again.Events[i].Position)
		require.Equal(t, first.Events[i].StreamVersion, again.Events[i].StreamVersion)
	}

	dup := func(err error, id uuid.UUID) {
		t.Helper()
		require.ErrorIs(t, err, eventstore.ErrDuplicateEvent)
		var de *eventstore.DuplicateEventError
		require.ErrorAs(t, err, &de)
		require.Equal(t, id, de.EventID)
	}
	partial := []eventstore.EventData{Event("A", 1), Event("C", 3)}
	partial[0].ID, partial[1].ID = a, c
	_, err = s.Append(ctx, "s", eventstore.Any, partial...)
	dup(err, a)
	elsewhere := Event("A", 1)
	elsewhere.ID = b
	_, err = s.Append(ctx, "other", eventstore.Any, elsewhere)
	dup(err, b)
	reordered := []eventstore.EventData{batch[1], batch[0]}
	_, err = s.Append(ctx, "s", eventstore.Any, reordered...)
	dup(err, b)
	retyped := batch[0]
	retyped.Type = "Z"
	_, err = s.Append(ctx, "s", eventstore.Any, retyped)
	dup(err, a)
	single := batch[1]
	again, err = s.Append(ctx, "s", eventstore.Any, single)
	require.NoError(t, err, "repeating the tail of an earlier append is a repeat too")
	require.True(t, again.Idempotent)
	require.Equal(t, int64(2), again.StreamVersion)

	Settle(t, s, first.Last())

	all := ReadAll(t, s, eventstore.ReadOptions{})
	require.Len(t, all, 2, "never a duplicate row")
}

func testTypeFilter(t *testing.T, s eventstore.Store) {
	ctx := context.Background()
	types := []string{"A", "B", "C"}
	var last eventstore.AppendResult
	for i := range 30 {
		var err error
		last, err = s.Append(ctx, fmt.Sprintf("s-%d", i%4), eventstore.Any, Event(types[i%3], i))
		require.NoError(t, err)
	}
	Settle(t, s, last.Last())
	got := ReadAll(t, s, eventstore.ReadOptions{Types: []string{"A", "C"}, Limit: 4})
	require.Len(t, got, 20)
	for i, e := range got {
		require.Contains(t, []string{"A", "C"}, e.Type)
		if i > 0 {
			require.True(t, got[i-1].Position.Less(e.Position))
		}
	}
	twice := ReadAll(t, s, eventstore.ReadOptions{Types: []string{"C", "A", "C"}, Limit: 4})
	require.Equal(t, got, twice, "a type named twice counts once")
	none, err := s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{Types: []string{"Unknown"}})
	require.NoError(t, err)
	require.Empty(t, none)

	full, err := s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{Types: []string{"B"}})
	require.NoError(t, err)
	bare, err := s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{Types: []string{"B"}, OmitPayload: true})
	require.NoError(t, err)
	require.Len(t, bare, len(full))
	for i := range bare {
		require.Nil(t, bare[i].Payload, "OmitPayload leaves the payload out")
		require.Nil(t, bare[i].Metadata)
		full[i].Payload, full[i].Metadata = nil, nil
		require.Equal(t, full[i], bare[i], "and nothing else")
	}
}

func testEmpty(t *testing.T, s eventstore.Store) {
	ctx := context.Background()
	events, err := s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{})
	require.NoError(t, err)
	require.Empty(t, events)
	stream, err := s.ReadStream(ctx, "nothing-here", 0, 0)
	require.NoError(t, err, "a stream without events reads as empty")
	require.Empty(t, stream)
	head, err := s.Head(ctx)
	require.NoError(t, err)
	require.True(t, head.IsZero())

	res, err := s.Append(ctx, "s", eventstore.Any, Event("A", 1))
	require.NoError(t, err)
	Settle(t, s, res.Last())
	stream, err = s.ReadStream(ctx, "s", 1, 0)
	require.NoError(t, err)
	require.Empty(t, stream, "nothing after the last version")
	head, err = s.Head(ctx)
	require.NoError(t, err)
	events, err = s.Read(ctx, head, eventstore.ReadOptions{})
	require.NoError(t, err)
	require.Empty(t, events, "nothing after the head")
}

func testLimits(t *testing.T, s eventstore.Store) {
	ctx := context.Background()
	var last eventstore.AppendResult
	for i := range 7 {
		var err error
		last, err = s.Append(ctx, "s", eventstore.Any, Event("A", i+1))
		require.NoError(t, err)
	}
	Settle(t, s, last.Last())
	page, err := s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{Limit: 3})
	require.NoError(t, err)
	require.Len(t, page, 3)
	require.Len(t, ReadAll(t, s, eventstore.ReadOptions{Limit: 2}), 7)

	stream, err := s.ReadStream(ctx, "s", 2, 3)
	require.NoError(t, err)
	require.Len(t, stream, 3)
	require.Equal(t, []int64{3, 4, 5}, []int64{stream[0].StreamVersion, stream[1].StreamVersion, stream[2].StreamVersion})

	for _, limit := range []int{-1, eventstore.ReadLimitMax + 1} {
		_, err = s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{Limit: limit})
		require.ErrorIs(t, err, eventstore.ErrInvalidInput, "limit %d", limit)
		_, err = s.ReadStream(ctx, "s", 0, limit)
		require.ErrorIs(t, err, eventstore.ErrInvalidInput, "limit %d", limit)
	}
	max, err := s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{Limit: eventstore.ReadLimitMax})
	require.NoError(t, err)
	require.Len(t, max, 7)
	_, err = s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{Types: []string{""}})
	require.ErrorIs(t, err, eventstore.ErrInvalidInput)
}

func testPositionsIncrease(t *testing.T, s eventstore.Store) {
	ctx := context.Background()
	var last eventstore.Position
	for i := range 40 {
		events := []eventstore.EventData{Event("A", i)}
		if i%3 == 0 {
			events = append(events, Event("B", i))
		}
		res, err := s.Append(ctx, fmt.Sprintf("s-%d", i%5), eventstore.Any, events...)
		require.NoError(t, err)
		last = res.Last()
	}
	Settle(t, s, last)
	all := ReadAll(t, s, eventstore.ReadOptions{Limit: 7})
	require.Len(t, all, 54)
	versions := map[string]int64{}
	seen := map[uuid.UUID]bool{}
	for i, e := range all {
		if i > 0 {
			require.True(t, all[i-1].Position.Less(e.Position), "strictly increasing positions at %d", i)
		}
		require.Equal(t, versions[e.StreamID]+1, e.StreamVersion, "stream %s in version order", e.StreamID)
		versions[e.StreamID] = e.StreamVersion
		require.False(t, seen[e.ID])
		seen[e.ID] = true
	}
}

func testHead(t *testing.T, s eventstore.Store) {
	ctx := context.Background()
	var last eventstore.Position
	for i := range 5 {
		res, err := s.Append(ctx, fmt.Sprintf("s-%d", i), eventstore.Any, Event("A", i), Event("B", i))
		require.NoError(t, err)
		Settle(t, s, res.Last())
		head, err := s.Head(ctx)
		require.NoError(t, err)
		require.Equal(t, res.Last(), head)
		require.True(t, last.Less(head))
		last = head
	}
	all := ReadAll(t, s, eventstore.ReadOptions{})
	require.Equal(t, all[len(all)-1].Position, last)
}

func testBadInput(t *testing.T, s eventstore.Store) {
	ctx := context.Background()
	okEvent := Event("A", 1)
	dupID := uuid.New()
	cases := []struct {
		name     string
		stream   string
		events   []eventstore.EventData
		field    string
		contains string
	}{
		{"empty stream id", "", []eventstore.EventData{okEvent}, "StreamID", "empty"},
		{"blank stream id", "  ", []eventstore.EventData{okEvent}, "StreamID", "empty"},
		{"long stream id", strings.Repeat("x", eventstore.MaxStreamIDLength+1), []eventstore.EventData{okEvent}, "StreamID", "at most"},
		{"NUL in stream id", "a\x00b", []eventstore.EventData{okEvent}, "StreamID", "NUL"},
		{"bad UTF-8 in stream id", "a\xffb", []eventstore.EventData{okEvent}, "StreamID", "UTF-8"},
		{"no events", "s", nil, "events", "at least one"},
		{"empty type", "s", []eventstore.EventData{{Payload: json.RawMessage(`{}`)}}, "Type", "empty"},
		{"long type", "s", []eventstore.EventData{{Type: strings.Repeat("T", eventstore.MaxTypeLength+1), Payload: json.RawMessage(`{}`)}}, "Type", "at most"},
		{"empty payload", "s", []eventstore.EventData{{Type: "A"}}, "Payload", "empty"},
		{"invalid JSON payload", "s", []eventstore.EventData{okEvent, {Type: "A", Payload: json.RawMessage(`{"a":`)}}, "Payload", "not valid JSON"},
		{"NUL escape in payload", "s", []eventstore.EventData{{Type: "A", Payload: json.RawMessage(`{"a": "x\u0000y"}`)}}, "Payload", `\u0000`},
		{"invalid metadata", "s", []eventstore.EventData{{Type: "A", Payload: json.RawMessage(`{}`), Metadata: json.RawMessage(`nope`)}}, "Metadata", "not valid JSON"},
		{"same id twice", "s", []eventstore.EventData{{ID: dupID, Type: "A", Payload: json.RawMessage(`{}`)}, {ID: dupID, Type: "A", Payload: json.RawMessage(`{}`)}}, "ID", "own id"},
	}
	for _, tc := range cases {
		_, err := s.Append(ctx, tc.stream, eventstore.Any, tc.events...)
		require.ErrorIs(t, err, eventstore.ErrInvalidInput, tc.name)
		var ve *eventstore.ValidationError
		require.ErrorAs(t, err, &ve, tc.name)
		require.Equal(t, tc.field, ve.Field, tc.name)
		require.Contains(t, err.Error(), tc.contains, tc.name)
	}
	// An escaped backslash before "u0000" is an ordinary string, and fine.
	valid, err := s.Append(ctx, "s", eventstore.Any, eventstore.EventData{Type: "A", Payload: json.RawMessage(`{"path": "C:\\u0000"}`)})
	require.NoError(t, err)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = s.Append(cancelled, "s", eventstore.Any, okEvent)
	require.ErrorIs(t, err, context.Canceled)
	_, err = s.Read(cancelled, eventstore.Position{}, eventstore.ReadOptions{})
	require.ErrorIs(t, err, context.Canceled)
	_, err = s.ReadStream(cancelled, "s", 0, 0)
	require.ErrorIs(t, err, context.Canceled)
	_, err = s.Head(cancelled)
	require.ErrorIs(t, err, context.Canceled)

	Settle(t, s, valid.Last())
	all := ReadAll(t, s, eventstore.ReadOptions{})
	require.Len(t, all, 1, "only the valid append wrote")
}

func testConcurrentAppends(t *testing.T, s eventstore.Store) {
	ctx := context.Background()
	const writers, each = 8, 10
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	var (
		mu   sync.Mutex
		last eventstore.Position
	)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				res, err := s.Append(ctx, "shared", eventstore.Any, Event("A", w*each+i))
				if err != nil {
					errs <- err
					continue
				}
				mu.Lock()
				if last.Less(res.Last()) {
					last = res.Last()
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err, "Append resolves races on one stream itself")
	}
	events, err := s.ReadStream(ctx, "shared", 0, 0)
	require.NoError(t, err)
	require.Len(t, events, writers*each)
	for i, e := range events {
		require.Equal(t, int64(i+1), e.StreamVersion)
	}
	Settle(t, s, last)
	require.Len(t, ReadAll(t, s, eventstore.ReadOptions{}), writers*each)
}

func testResultsAreCopies(t *testing.T, s eventstore.Store) {
	ctx := context.Background()
	in := Event("A", 1)
	res, err := s.Append(ctx, "s", eventstore.Any, in)
	require.NoError(t, err)
	Settle(t, s, res.Last())
	in.Payload[2] = 'X'
	read, err := s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{})
	require.NoError(t, err)
	read[0].Payload[2] = 'Y'
	again, err := s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{})
	require.NoError(t, err)
	require.JSONEq(t, `{"n": 1}`, string(again[0].Payload), "callers cannot change stored events")
}

// requireTooLarge checks that err refuses an append for limit, naming index, size and max.
func requireTooLarge(t *testing.T, err error, limit string, index, size, maxValue int) {
	t.Helper()
	require.ErrorIs(t, err, eventstore.ErrTooLarge)
	require.ErrorIs(t, err, eventstore.ErrInvalidInput, "a refused append is invalid input too")
	var tl *eventstore.TooLargeError
	require.ErrorAs(t, err, &tl)
	require.Equal(t, eventstore.TooLargeError{Limit: limit, Index: index, Size: size, Max: maxValue}, *tl)
	require.Contains(t, err.Error(), "Limits."+limit, "the message names the limit")
	require.Contains(t, err.Error(), "nothing was written")
	if index >= 0 {
		require.Contains(t, err.Error(), fmt.Sprintf("events[%d]", index))
	}
}

// jsonOfSize returns a JSON string value of exactly n bytes (n >= 2).
func jsonOfSize(n int) json.RawMessage {
	return json.RawMessage(`"` + strings.Repeat("x", n-2) + `"`)
}

// testTooLarge checks the default limits: an event, an append and a count just above them are
// refused and write nothing; just at them they are accepted.
func testTooLarge(t *testing.T, s eventstore.Store) {
	ctx := context.Background()
	at := eventstore.EventData{Type: "A", Payload: jsonOfSize(eventstore.MaxEventBytesDefault - 8), Metadata: json.RawMessage(`{"a": 1}`)}
	res, err := s.Append(ctx, "s", eventstore.NoStream, at)
	require.NoError(t, err, "an event of exactly MaxEventBytesDefault is accepted")

	over := eventstore.EventData{Type: "A", Payload: jsonOfSize(eventstore.MaxEventBytesDefault - 7), Metadata: json.RawMessage(`{"a": 1}`)}
	_, err = s.Append(ctx, "s", eventstore.Any, Event("A", 1), over)
	requireTooLarge(t, err, eventstore.LimitEventBytes, 1, eventstore.MaxEventBytesDefault+1, eventstore.MaxEventBytesDefault)

	// Sizes are checked before the JSON is scanned: a 2 MiB payload that is not JSON either is
	// refused for its size.
	_, err = s.Append(ctx, "s", eventstore.Any, eventstore.EventData{Type: "A", Payload: json.RawMessage(strings.Repeat("{", 2<<20))})
	requireTooLarge(t, err, eventstore.LimitEventBytes, 0, 2<<20, eventstore.MaxEventBytesDefault)

	// 17 events of 1 MiB each: every one within MaxEventBytes, 17 MiB in all.
	mib := eventstore.EventData{Type: "A", Payload: jsonOfSize(1 << 20)}
	many := make([]eventstore.EventData, 17)
	for i := range many {
		many[i] = mib
	}
	_, err = s.Append(ctx, "s", eventstore.Any, many...)
	requireTooLarge(t, err, eventstore.LimitAppendBytes, -1, 17<<20, eventstore.MaxAppendBytesDefault)

	tiny := make([]eventstore.EventData, eventstore.MaxAppendEventsDefault+1)
	for i := range tiny {
		tiny[i] = eventstore.EventData{Type: "A", Payload: json.RawMessage(`{}`)}
	}
	_, err = s.Append(ctx, "s", eventstore.Any, tiny...)
	requireTooLarge(t, err, eventstore.LimitAppendEvents, -1, eventstore.MaxAppendEventsDefault+1, eventstore.MaxAppendEventsDefault)

	Settle(t, s, res.Last())
	all := ReadAll(t, s, eventstore.ReadOptions{Limit: 10})
	require.Len(t, all, 1, "only the append within the limits wrote")
	stream, err := s.ReadStream(ctx, "s", 0, 0)
	require.NoError(t, err)
	require.Len(t, stream, 1)
}

// testTooLargeCustom checks limits of 100 bytes per event, 150 per append and 3 events.
func testTooLargeCustom(t *testing.T, s eventstore.Store) {
	ctx := context.Background()
	_, err := s.Append(ctx, "s", eventstore.Any, eventstore.EventData{Type: "A", Payload: jsonOfSize(60), Metadata: jsonOfSize(41)})
	requireTooLarge(t, err, eventstore.LimitEventBytes, 0, 101, 100)
	_, err = s.Append(ctx, "s", eventstore.Any, eventstore.EventData{Type: "A", Payload: jsonOfSize(80)}, eventstore.EventData{Type: "A", Payload: jsonOfSize(71)})
	requireTooLarge(t, err, eventstore.LimitAppendBytes, -1, 151, 150)
	four := []eventstore.EventData{Event("A", 1), Event("A", 2), Event("A", 3), Event("A", 4)}
	_, err = s.Append(ctx, "s", eventstore.Any, four...)
	requireTooLarge(t, err, eventstore.LimitAppendEvents, -1, 4, 3)

	fifty := eventstore.EventData{Type: "A", Payload: jsonOfSize(50)}
	res, err := s.Append(ctx, "s", eventstore.NoStream, fifty, fifty, fifty)
	require.NoError(t, err, "an append at every limit is accepted")
	Settle(t, s, res.Last())
	require.Len(t, ReadAll(t, s, eventstore.ReadOptions{}), 3, "only the append within the limits wrote")
}
