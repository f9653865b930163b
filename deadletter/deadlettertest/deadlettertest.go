// Package deadlettertest is the suite every deadletter.Store implementation passes, and the
// helpers it is written with.
//
// Call Run from a test of the implementation's package with a function that returns a new,
// empty store for each subtest. The suite also drives deadletter.Replay against the store.
package deadlettertest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/deadletter/internal/dlstore"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/trigger"
)

// NewStoreFunc returns a new, empty store for one subtest.
type NewStoreFunc func(t *testing.T) deadletter.Store

// Run runs the suite against stores made by newStore. Subtests run in parallel.
func Run(t *testing.T, newStore NewStoreFunc) {
	tests := []struct {
		name string
		run  func(t *testing.T, s deadletter.Store)
	}{
		{"AddAndGet", testAddAndGet},
		{"DefaultsAndTextCleaning", testDefaults},
		{"FoldsRepeatedFailuresOfOneEvent", testFold},
		{"FoldFillsAMissingStream", testFoldFillsStream},
		{"NewRecordAfterResolve", testNewRecordAfterResolve},
		{"InvalidTriggersFoldByMessageUUID", testInvalidTriggersFold},
		{"ListFiltersAndPaging", testList},
		{"ListByProjectionIncludesItsPartitions", testListPartitions},
		{"NotFound", testNotFound},
		{"MarkReplayedChangesOnlyNamedEligibleRecords", testMarkReplayed},
		{"Resolve", testResolve},
		{"ResolvePassedHealsOnlyPassedEvents", testResolvePassed},
		{"PurgeChangesOnlyWhatItSelects", testPurge},
		{"ReplayPublishesOneAddressedTriggerPerProjection", testReplay},
		{"ReplayWithNothingToDo", testReplayNothingToDo},
		{"ReplayAllIsBoundedAndIdempotent", testReplayAllBounded},
		{"ReplayIDs", testReplayIDs},
		{"ReplayRefusesBadFilters", testReplayRefuses},
		{"ConcurrentAddsFoldIntoOneRecord", testConcurrentAdds},
		{"BadInput", testBadInput},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, newStore(t))
		})
	}
}

// Base returns the time the suite's entries are dated from.
func Base() time.Time { return time.Date(2021, 3, 4, 5, 6, 7, 123456000, time.UTC) }

// EventEntry returns an entry of projection for a handler failure on the event id, given up
// at at after 3 attempts.
func EventEntry(projection string, id uuid.UUID, at time.Time) deadletter.Entry {
	return deadletter.Entry{
		Projection:  projection,
		MessageUUID: uuid.NewString(),
		Payload:     fmt.Appendf(nil, `{"v":1,"pos":"7/%d","at":"2021-03-04T05:06:07Z","reason":"append"}`, at.Unix()%1000),
		Metadata:    map[string]string{trigger.MetadataKey: "1"},
		Error:       "projection " + projection + ": handler failed on " + id.String(),
		FailingEvent: &eventstore.EventRef{
			Position: eventstore.Position{TransactionID: 1<<40 + 7, GlobalPosition: 4242},
			ID:       id,
			Type:     "TicketWasRegistered",
			StreamID: "ticket-" + id.String(),
		},
		Attempts: 3,
		At:       at,
	}
}

// InvalidEntry returns an entry of projection for a trigger message that does not decode.
func InvalidEntry(projection, messageUUID string, at time.Time) deadletter.Entry {
	return deadletter.Entry{
		Projection:  projection,
		MessageUUID: messageUUID,
		Payload:     []byte("\x00\xffnot a trigger"),
		Error:       "trigger: invalid trigger: not a JSON trigger object",
		Attempts:    1,
		At:          at,
	}
}

// Publisher is a trigger.Publisher that records what it is given. Set Err to make Publish
// fail. It is safe for concurrent use.
type Publisher struct {
	mu       sync.Mutex
	triggers []trigger.Trigger
	// Err, if set, is returned by Publish, which then records nothing.
	Err error
}

// Publish implements trigger.Publisher.
func (p *Publisher) Publish(_ context.Context, t trigger.Trigger) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.Err != nil {
		return p.Err
	}
	p.triggers = append(p.triggers, t)
	return nil
}

// Triggers returns the triggers published so far, in order.
func (p *Publisher) Triggers() []trigger.Trigger {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.triggers)
}

// Projections returns the projections of the triggers published so far, in order.
func (p *Publisher) Projections() []string {
	var names []string
	for _, t := range p.Triggers() {
		names = append(names, t.Projection)
	}
	return names
}

// All lists every record of s, in pages of 7.
func All(t testing.TB, s deadletter.Store) []deadletter.Record {
	t.Helper()
	var all []deadletter.Record
	f := deadletter.Filter{Limit: 7}
	for {
		page, err := s.List(context.Background(), f)
		require.NoError(t, err)
		all = append(all, page...)
		if len(page) < f.Limit {
			return all
		}
		f.AfterID = page[len(page)-1].ID
	}
}

func add(t testing.TB, s deadletter.Store, e deadletter.Entry) deadletter.Record {
	t.Helper()
	r, err := s.Add(context.Background(), e)
	require.NoError(t, err)
	return r
}

func get(t testing.TB, s deadletter.Store, id int64) deadletter.Record {
	t.Helper()
	r, err := s.Get(context.Background(), id)
	require.NoError(t, err)
	return r
}

// resolved adds an entry and resolves its record.
func resolved(t testing.TB, s deadletter.Store, e deadletter.Entry) deadletter.Record {
	t.Helper()
	r := add(t, s, e)
	require.NoError(t, s.Resolve(context.Background(), r.ID, "ann", "fixed", e.At.Add(time.Minute)))
	return get(t, s, r.ID)
}

// replayed adds an entry and marks its record replayed.
func replayed(t testing.TB, s deadletter.Store, e deadletter.Entry) deadletter.Record {
	t.Helper()
	r := add(t, s, e)
	n, err := s.MarkReplayed(context.Background(), []int64{r.ID}, "ann", e.At.Add(time.Minute))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	return get(t, s, r.ID)
}

// stable is r without the store's clock, for comparing records across changes.
func stable(r deadletter.Record) deadletter.Record {
	r.UpdatedAt = time.Time{}
	return r
}

func stableAll(rs []deadletter.Record) []deadletter.Record {
	out := make([]deadletter.Record, len(rs))
	for i, r := range rs {
		out[i] = stable(r)
	}
	return out
}

func ids(rs []deadletter.Record) []int64 {
	out := make([]int64, len(rs))
	for i, r := range rs {
		out[i] = r.ID
	}
	return out
}

func testAddAndGet(t *testing.T, s deadletter.Store) {
	ctx := context.Background()
	eventID := uuid.New()
	in := deadletter.Entry{
		Projection:  "tickets",
		MessageUUID: "8f14e45f-ceea-467f-a0e1-b2a8f1c52c2e",
		Payload:     []byte{0, 1, 0xff, '{', 0},
		Metadata:    map[string]string{trigger.MetadataKey: "1", "x-trace": "abc"},
		Error:       "projection tickets: handling event: boom",
		FailingEvent: &eventstore.EventRef{
			Position: eventstore.Position{TransactionID: 1<<40 + 7, GlobalPosition: 1234},
			ID:       eventID,
			Type:     "TicketWasRegistered",
			StreamID: "ticket-1",
		},
		Attempts: 5,
		At:       Base().Add(789 * time.Nanosecond).In(time.FixedZone("CET", 3600)),
	}
	before := time.Now()
	r := add(t, s, in)
	require.Positive(t, r.ID)
	require.Equal(t, "tickets", r.Projection)
	require.Equal(t, in.MessageUUID, r.MessageUUID)
	require.Equal(t, in.Payload, r.Payload, "the payload is kept byte for byte")
	require.Equal(t, in.Metadata, r.Metadata)
	require.Equal(t, in.Error, r.Error)
	require.Equal(t, in.FailingEvent, r.FailingEvent)
	require.Equal(t, 5, r.Attempts)
	require.Equal(t, 1, r.Count)
	require.Equal(t, Base(), r.FirstFailedAt, "times are kept in UTC to the microsecond")
	require.Equal(t, Base(), r.LastFailedAt)
	require.Equal(t, deadletter.StatusFailed, r.Status)
	require.Empty(t, r.ReplayedBy)
	require.True(t, r.ReplayedAt.IsZero())
	require.Zero(t, r.Replays)
	require.Empty(t, r.ResolvedBy)
	require.True(t, r.ResolvedAt.IsZero())
	require.Empty(t, r.ResolveNote)
	require.WithinDuration(t, before, r.UpdatedAt, time.Minute)

	got := get(t, s, r.ID)
	require.Equal(t, r, got, "Add returns the record as stored")

	// Records are copies.
	got.Payload[0] = 'X'
	got.Metadata["x-trace"] = "changed"
	got.FailingEvent.Type = "changed"
	in.Payload[1] = 'Y'
	in.Metadata["x-trace"] = "changed"
	require.Equal(t, r, get(t, s, r.ID), "changing a returned record or the entry does not change the store")

	other := add(t, s, EventEntry("tickets", uuid.New(), Base()))
	require.Greater(t, other.ID, r.ID, "later records have larger IDs")
	list, err := s.List(ctx, deadletter.Filter{})
	require.NoError(t, err)
	require.Equal(t, []deadletter.Record{r, other}, list)
}

func testDefaults(t *testing.T, s deadletter.Store) {
	before := time.Now()
	r := add(t, s, deadletter.Entry{
		Projection:  "tickets",
		MessageUUID: "m\x00-1",
		Error:       "bad\x00 byte \xff here",
		Metadata:    map[string]string{"k\x00": "v\xfe"},
	})
	require.Equal(t, 1, r.Attempts, "Attempts defaults to 1")
	require.WithinDuration(t, before, r.FirstFailedAt, time.Minute, "At defaults to the time of the Add")
	require.Equal(t, r.FirstFailedAt, r.LastFailedAt)
	require.Nil(t, r.Payload, "an empty payload reads as nil")
	require.Nil(t, r.FailingEvent)
	require.Equal(t, "m-1", r.MessageUUID, "NUL bytes are dropped")
	require.Equal(t, "bad byte \uFFFD here", r.Error, "invalid UTF-8 is replaced")
	require.Equal(t, map[string]string{"k": "v\uFFFD"}, r.Metadata)

	bad := add(t, s, deadletter.Entry{
		Projection: "tickets", MessageUUID: "m-3",
		FailingEvent: &eventstore.EventRef{ID: uuid.New(), Type: "Ticket\x00Closed", StreamID: "ticket\xff-1"},
	})
	require.Equal(t, "TicketClosed", bad.FailingEvent.Type, "the failing event's text is cleaned too")
	require.Equal(t, "ticket\uFFFD-1", bad.FailingEvent.StreamID)

	long := add(t, s, deadletter.Entry{Projection: "tickets", MessageUUID: "m-2", Error: strings.Repeat("é", deadletter.ErrorMaxBytes)})
	require.LessOrEqual(t, len(long.Error), deadletter.ErrorMaxBytes+len("…"))
	require.True(t, strings.HasSuffix(long.Error, "é…"), "a long error is cut on a character boundary")
	require.Nil(t, long.Metadata, "no metadata reads as nil")

	empty := add(t, s, deadletter.Entry{Projection: "tickets", MessageUUID: "m-3", Metadata: map[string]string{}, Payload: []byte{}})
	require.Nil(t, empty.Metadata)
	require.Nil(t, empty.Payload)
}

// testFoldFillsStream: a record without the failing event's stream (written before dead
// letters kept it) takes the stream of the next delivery that names it, and keeps it.
func testFoldFillsStream(t *testing.T, s deadletter.Store) {
	noStream := EventEntry("tickets", uuid.New(), Base())
	noStream.FailingEvent.StreamID = ""
	r := add(t, s, noStream)
	require.Empty(t, r.FailingEvent.StreamID)

	withStream := EventEntry("tickets", noStream.FailingEvent.ID, Base())
	r = add(t, s, withStream)
	require.Equal(t, 2, r.Count)
	require.Equal(t, withStream.FailingEvent.StreamID, r.FailingEvent.StreamID)

	later := EventEntry("tickets", noStream.FailingEvent.ID, Base())
	later.FailingEvent.StreamID = "another"
	r = add(t, s, later)
	require.Equal(t, 3, r.Count)
	require.Equal(t, withStream.FailingEvent.StreamID, r.FailingEvent.StreamID, "a known stream is kept")
}

func testFold(t *testing.T, s deadletter.Store) {
	ctx := context.Background()
	event := uuid.New()
	first := EventEntry("tickets", event, Base())
	r1 := add(t, s, first)

	second := EventEntry("tickets", event, Base().Add(time.Minute))
	second.Error, second.Attempts, second.Payload = "boom 2", 2, []byte("second")
	second.Metadata = map[string]string{"delivery": "2"}
	r2 := add(t, s, second)
	require.Equal(t, r1.ID, r2.ID, "a second failure of the same event folds")
	require.Equal(t, 2, r2.Count)
	require.Equal(t, 5, r2.Attempts, "attempts add up")
	require.Equal(t, Base(), r2.FirstFailedAt)
	require.Equal(t, Base().Add(time.Minute), r2.LastFailedAt)
	require.Equal(t, "boom 2", r2.Error, "the latest error is kept")
	require.Equal(t, second.MessageUUID, r2.MessageUUID, "the latest delivery is kept")
	require.Equal(t, []byte("second"), r2.Payload)
	require.Equal(t, map[string]string{"delivery": "2"}, r2.Metadata)
	require.Equal(t, first.FailingEvent, r2.FailingEvent)
	require.Equal(t, deadletter.StatusFailed, r2.Status)

	// An entry dated before the first widens the span; LastFailedAt never goes back.
	early := EventEntry("tickets", event, Base().Add(-time.Hour))
	early.Attempts = 1
	r3 := add(t, s, early)
	require.Equal(t, r1.ID, r3.ID)
	require.Equal(t, 3, r3.Count)
	require.Equal(t, 6, r3.Attempts)
	require.Equal(t, Base().Add(-time.Hour), r3.FirstFailedAt)
	require.Equal(t, Base().Add(time.Minute), r3.LastFailedAt)

	// Another projection, or another event, is another record.
	otherProjection := add(t, s, EventEntry("billing", event, Base()))
	otherEvent := add(t, s, EventEntry("tickets", uuid.New(), Base()))
	require.NotEqual(t, r1.ID, otherProjection.ID)
	require.NotEqual(t, r1.ID, otherEvent.ID)
	require.NotEqual(t, otherProjection.ID, otherEvent.ID)

	// A replayed record that fails again returns to failed and keeps its replay history.
	n, err := s.MarkReplayed(ctx, []int64{r1.ID}, "ann", Base().Add(2*time.Minute))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	r4 := add(t, s, EventEntry("tickets", event, Base().Add(3*time.Minute)))
	require.Equal(t, r1.ID, r4.ID)
	require.Equal(t, deadletter.StatusFailed, r4.Status)
	require.Equal(t, 4, r4.Count)
	require.Equal(t, 1, r4.Replays)
	require.Equal(t, "ann", r4.ReplayedBy)
	require.Equal(t, Base().Add(2*time.Minute), r4.ReplayedAt)
	require.Len(t, All(t, s), 3)
}

func testNewRecordAfterResolve(t *testing.T, s deadletter.Store) {
	ctx := context.Background()
	event := uuid.New()
	r1 := add(t, s, EventEntry("tickets", event, Base()))
	add(t, s, EventEntry("tickets", event, Base().Add(time.Minute)))
	require.NoError(t, s.Resolve(ctx, r1.ID, "ann", "skipped the event", Base().Add(2*time.Minute)))
	old := get(t, s, r1.ID)

	r2 := add(t, s, EventEntry("tickets", event, Base().Add(3*time.Minute)))
	require.NotEqual(t, r1.ID, r2.ID, "a resolved record never folds")
	require.Equal(t, 1, r2.Count)
	require.Equal(t, 3, r2.Attempts)
	require.Equal(t, deadletter.StatusFailed, r2.Status)
	require.Equal(t, Base().Add(3*time.Minute), r2.FirstFailedAt)

	r3 := add(t, s, EventEntry("tickets", event, Base().Add(4*time.Minute)))
	require.Equal(t, r2.ID, r3.ID, "the new record folds what follows")
	require.Equal(t, 2, r3.Count)
	require.Equal(t, stable(old), stable(get(t, s, r1.ID)), "the resolved record is untouched")
	require.Equal(t, 2, old.Count)
}

func testInvalidTriggersFold(t *testing.T, s deadletter.Store) {
	r1 := add(t, s, InvalidEntry("tickets", "msg-1", Base()))
	require.Nil(t, r1.FailingEvent)
	require.Equal(t, []byte("\x00\xffnot a trigger"), r1.Payload)

	again := InvalidEntry("tickets", "msg-1", Base().Add(time.Minute))
	again.Error = "trigger: invalid trigger: version 9"
	r2 := add(t, s, again)
	require.Equal(t, r1.ID, r2.ID, "a redelivered invalid message folds")
	require.Equal(t, 2, r2.Count)
	require.Equal(t, 2, r2.Attempts)
	require.Equal(t, again.Error, r2.Error)

	other := add(t, s, InvalidEntry("tickets", "msg-2", Base()))
	otherProjection := add(t, s, InvalidEntry("billing", "msg-1", Base()))
	// A handler failure delivered in message msg-1 is about its event, not the message.
	e := EventEntry("tickets", uuid.New(), Base())
	e.MessageUUID = "msg-1"
	handlerFailure := add(t, s, e)
	distinct := map[int64]bool{r1.ID: true, other.ID: true, otherProjection.ID: true, handlerFailure.ID: true}
	require.Len(t, distinct, 4, "another message, another projection or a failing event: another record")
	require.Len(t, All(t, s), 4)

	// Without a message UUID, invalid triggers of a projection fold together.
	n1 := add(t, s, InvalidEntry("tickets", "", Base()))
	n2 := add(t, s, InvalidEntry("tickets", "", Base()))
	require.Equal(t, n1.ID, n2.ID)
	require.Equal(t, 2, n2.Count)
}

// testListPartitions: a projection's filter selects its partitions' records (unit names
// "<projection>.pNN") and no other projection's, however alike the names.
func testListPartitions(t *testing.T, s deadletter.Store) {
	ctx := context.Background()
	var want []int64
	for _, p := range []string{"orders", "orders.p0", "orders.p13", "orders.pa", "orders.p", "orders.p1x", "orders2.p1", "orders-p1", "order.p1", "xorders.p1"} {
		rec := add(t, s, EventEntry(p, uuid.New(), Base()))
		if p == "orders" || p == "orders.p0" || p == "orders.p13" {
			want = append(want, rec.ID)
		}
	}
	got, err := s.List(ctx, deadletter.Filter{Projection: "orders"})
	require.NoError(t, err)
	require.Equal(t, want, ids(got))
	got, err = s.List(ctx, deadletter.Filter{Projection: "orders.p13"})
	require.NoError(t, err)
	require.Equal(t, want[2:], ids(got), "a partition's own filter selects it alone")
}

func testList(t *testing.T, s deadletter.Store) {
	ctx := context.Background()
	var recs []deadletter.Record
	for i := range 4 {
		recs = append(recs, add(t, s, EventEntry("tickets", uuid.New(), Base().Add(time.Duration(i)*time.Minute))))
	}
	recs = append(recs, add(t, s, EventEntry("billing", uuid.New(), Base())))
	recs = append(recs, replayed(t, s, EventEntry("billing", uuid.New(), Base())))
	recs = append(recs, resolved(t, s, EventEntry("tickets", uuid.New(), Base())))
	recs = append(recs, add(t, s, InvalidEntry("billing", "msg-1", Base())))
	recs[0] = replayed(t, s, EventEntry("tickets", recs[0].FailingEvent.ID, Base()))
	for i := range recs {
		recs[i] = get(t, s, recs[i].ID)
	}

	list := func(f deadletter.Filter) []deadletter.Record {
		t.Helper()
		got, err := s.List(ctx, f)
		require.NoError(t, err)
		return got
	}
	require.Equal(t, recs, list(deadletter.Filter{}), "everything, by ID")
	require.Equal(t, ids([]deadletter.Record{recs[0], recs[1], recs[2], recs[3], recs[6]}), ids(list(deadletter.Filter{Projection: "tickets"})))
	require.Equal(t, ids([]deadletter.Record{recs[4], recs[7]}), ids(list(deadletter.Filter{Status: []deadletter.Status{deadletter.StatusFailed}, Projection: "billing"})))
	require.Equal(t, ids([]deadletter.Record{recs[0], recs[5], recs[6]}),
		ids(list(deadletter.Filter{Status: []deadletter.Status{deadletter.StatusReplayed, deadletter.StatusResolved}})))
	require.Empty(t, list(deadletter.Filter{Projection: "nothing-here"}))

	// Paging.
	var paged []deadletter.Record
	f := deadletter.Filter{Limit: 3}
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10, "paging does not end")
		page := list(f)
		require.LessOrEqual(t, len(page), 3)
		if len(page) == 0 {
			break
		}
		paged = append(paged, page...)
		f.AfterID = page[len(page)-1].ID
	}
	require.Equal(t, recs, paged)
	require.Equal(t, ids(recs[2:4]), ids(list(deadletter.Filter{Projection: "tickets", AfterID: recs[1].ID, Limit: 2})))
	require.Empty(t, list(deadletter.Filter{AfterID: recs[len(recs)-1].ID}))

	// Limits.
	require.Len(t, list(deadletter.Filter{Limit: deadletter.ListLimitMax}), len(recs))
	for _, bad := range []deadletter.Filter{
		{Limit: -1},
		{Limit: deadletter.ListLimitMax + 1},
		{AfterID: -1},
		{Status: []deadletter.Status{"broken"}},
		{Projection: "Not A Name"},
	} {
		_, err := s.List(ctx, bad)
		require.ErrorIs(t, err, deadletter.ErrInvalidFilter, "%+v", bad)
	}
	_, err := s.List(ctx, deadletter.Filter{Limit: deadletter.ListLimitMax + 1})
	require.ErrorContains(t, err, "AfterID", "the error says how to page")
	_, err = s.List(ctx, deadletter.Filter{Status: []deadletter.Status{"broken"}})
	require.ErrorIs(t, err, deadletter.ErrUnknownStatus)
}

func testNotFound(t *testing.T, s deadletter.Store) {
	ctx := context.Background()
	_, err := s.Get(ctx, 12345)
	require.ErrorIs(t, err, deadletter.ErrNotFound)
	require.ErrorContains(t, err, "12345")
	var nf *deadletter.NotFoundError
	require.ErrorAs(t, err, &nf)
	require.Equal(t, int64(12345), nf.ID)

	err = s.Resolve(ctx, 12345, "ann", "", Base())
	require.ErrorIs(t, err, deadletter.ErrNotFound)

	n, err := s.MarkReplayed(ctx, []int64{12345}, "ann", Base())
	require.NoError(t, err)
	require.Zero(t, n)

	r := add(t, s, EventEntry("tickets", uuid.New(), Base()))
	n, err = s.Purge(ctx, deadletter.PurgeOptions{IncludeUnresolved: true, Now: Base().Add(time.Hour)})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = s.Get(ctx, r.ID)
	require.ErrorIs(t, err, deadletter.ErrNotFound, "a purged record is gone")
}

func testMarkReplayed(t *testing.T, s deadletter.Store) {
	ctx := context.Background()
	failed := add(t, s, EventEntry("tickets", uuid.New(), Base()))
	again := replayed(t, s, EventEntry("tickets", uuid.New(), Base()))
	done := resolved(t, s, EventEntry("tickets", uuid.New(), Base()))
	bystander := add(t, s, EventEntry("tickets", uuid.New(), Base()))
	before := All(t, s)

	at := Base().Add(time.Hour)
	n, err := s.MarkReplayed(ctx, []int64{failed.ID, again.ID, done.ID, failed.ID, 99999}, "bob", at)
	require.NoError(t, err)
	require.Equal(t, 2, n, "failed and replayed records change, each once; resolved and unknown ones do not")

	for _, id := range []int64{failed.ID, again.ID} {
		r := get(t, s, id)
		require.Equal(t, deadletter.StatusReplayed, r.Status)
		require.Equal(t, "bob", r.ReplayedBy)
		require.Equal(t, at, r.ReplayedAt)
	}
	require.Equal(t, 1, get(t, s, failed.ID).Replays)
	require.Equal(t, 2, get(t, s, again.ID).Replays)

	after := All(t, s)
	require.Equal(t, stable(before[2]), stable(after[2]), "the resolved record is untouched")
	require.Equal(t, before[3], after[3], "the record not named is untouched")
	require.Equal(t, bystander.ID, after[3].ID)
	require.Equal(t, deadletter.StatusFailed, after[3].Status)

	// Everything but the replay fields stays.
	want := stable(before[0])
	want.Status, want.ReplayedBy, want.ReplayedAt, want.Replays = deadletter.StatusReplayed, "bob", at, 1
	require.Equal(t, want, stable(after[0]))

	n, err = s.MarkReplayed(ctx, nil, "bob", at)
	require.NoError(t, err)
	require.Zero(t, n)
}

func testResolve(t *testing.T, s deadletter.Store) {
	ctx := context.Background()
	r := add(t, s, EventEntry("tickets", uuid.New(), Base()))
	bystander := add(t, s, EventEntry("tickets", uuid.New(), Base()))
	at := Base().Add(time.Hour)
	require.NoError(t, s.Resolve(ctx, r.ID, "ann", "skipped event 4242 after fixing the data", at))

	got := get(t, s, r.ID)
	want := stable(r)
	want.Status, want.ResolvedBy, want.ResolvedAt, want.ResolveNote = deadletter.StatusResolved, "ann", at, "skipped event 4242 after fixing the data"
	require.Equal(t, want, stable(got))
	require.Equal(t, bystander, get(t, s, bystander.ID))

	// Resolving again keeps the first resolution.
	require.NoError(t, s.Resolve(ctx, r.ID, "bob", "again", at.Add(time.Hour)))
	require.Equal(t, stable(got), stable(get(t, s, r.ID)))

	// A resolved record cannot be replayed.
	n, err := s.MarkReplayed(ctx, []int64{r.ID}, "bob", at)
	require.NoError(t, err)
	require.Zero(t, n)

	// A replayed record can be resolved; the note may be empty.
	rep := replayed(t, s, EventEntry("tickets", uuid.New(), Base()))
	require.NoError(t, s.Resolve(ctx, rep.ID, "ann", "", time.Time{}))
	got = get(t, s, rep.ID)
	require.Equal(t, deadletter.StatusResolved, got.Status)
	require.Empty(t, got.ResolveNote)
	require.False(t, got.ResolvedAt.IsZero(), "at defaults to now")
	require.Equal(t, 1, got.Replays)
}

// entryAt is EventEntry for a transient failure (marked with deadletter.MetadataTransient) on
// an event at position (tx, global).
func entryAt(projection string, tx uint64, global int64) deadletter.Entry {
	e := EventEntry(projection, uuid.New(), Base())
	e.FailingEvent.Position = eventstore.Position{TransactionID: tx, GlobalPosition: global}
	e.Metadata = map[string]string{deadletter.MetadataTransient: "sqlstate 55P03"}
	return e
}

func testResolvePassed(t *testing.T, s deadletter.Store) {
	ctx := context.Background()
	passed := eventstore.Position{TransactionID: 1<<40 + 7, GlobalPosition: 4242}
	before := add(t, s, entryAt("tickets", 1<<40+7, 4241))       // same transaction, earlier event
	at := add(t, s, entryAt("tickets", 1<<40+7, 4242))           // the position passed itself
	olderTx := add(t, s, entryAt("tickets", 1<<40+6, 9999))      // earlier transaction, larger global position
	rep := replayed(t, s, entryAt("tickets", 1<<40+7, 4000))     // replayed records heal too
	later := add(t, s, entryAt("tickets", 1<<40+7, 4243))        // not passed yet
	laterTx := add(t, s, entryAt("tickets", 1<<40+8, 1))         // later transaction, smaller global position
	other := add(t, s, entryAt("orders", 1<<40+7, 4000))         // another projection
	invalid := add(t, s, InvalidEntry("tickets", "m-1", Base())) // no failing event: never healed
	byHand := resolved(t, s, entryAt("tickets", 1<<40+7, 4100))  // resolved by an operator: kept
	bug := EventEntry("tickets", uuid.New(), Base())             // passed, but not a transient cause
	bug.FailingEvent.Position = eventstore.Position{TransactionID: 1<<40 + 7, GlobalPosition: 4001}
	notTransient := add(t, s, bug)
	when := Base().Add(time.Hour)

	n, err := s.ResolvePassed(ctx, "tickets", passed, when)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	for _, r := range []deadletter.Record{before, at, olderTx} {
		got := get(t, s, r.ID)
		want := stable(r)
		want.Status, want.ResolvedBy, want.ResolvedAt = deadletter.StatusResolved, deadletter.HealedBy, when
		want.ResolveNote = dlstore.HealedNote(passed, when)
		require.Equal(t, want, stable(got), "record %d passed", r.ID)
		require.True(t, got.Healed())
		require.Contains(t, got.ResolveNote, "healed: projection passed position "+passed.String())
	}
	for _, r := range []deadletter.Record{rep, later, laterTx, other, invalid, byHand, notTransient} {
		got := get(t, s, r.ID)
		require.Equal(t, stable(r), stable(got), "record %d is left alone", r.ID)
		require.False(t, got.Healed())
	}

	// Healed records are resolved: a new failure on the same event starts a new record, and a
	// second call changes nothing.
	e := entryAt("tickets", 1<<40+7, 4242)
	e.FailingEvent.ID = at.FailingEvent.ID
	fresh := add(t, s, e)
	require.NotEqual(t, at.ID, fresh.ID)
	require.Equal(t, 1, fresh.Count)
	n, err = s.ResolvePassed(ctx, "tickets", eventstore.Position{TransactionID: 1<<40 + 7, GlobalPosition: 4241}, time.Time{})
	require.NoError(t, err)
	require.Zero(t, n)

	_, err = s.ResolvePassed(ctx, "", passed, when)
	require.ErrorIs(t, err, deadletter.ErrInvalidInput)
}

func testPurge(t *testing.T, s deadletter.Store) {
	ctx := context.Background()
	oldResolved := resolved(t, s, EventEntry("tickets", uuid.New(), Base()))
	newResolved := resolved(t, s, EventEntry("tickets", uuid.New(), Base().Add(90*time.Minute)))
	oldFailed := add(t, s, EventEntry("tickets", uuid.New(), Base()))
	oldReplayed := replayed(t, s, EventEntry("billing", uuid.New(), Base()))
	newFailed := add(t, s, EventEntry("billing", uuid.New(), Base().Add(90*time.Minute)))
	before := All(t, s)

	now := Base().Add(2 * time.Hour)
	n, err := s.Purge(ctx, deadletter.PurgeOptions{OlderThan: time.Hour, Now: now})
	require.NoError(t, err)
	require.Equal(t, 1, n, "by default only resolved records older than OlderThan go")
	require.Equal(t, stableAll(before[1:]), stableAll(All(t, s)), "the other records are untouched")
	require.Equal(t, ids([]deadletter.Record{newResolved, oldFailed, oldReplayed, newFailed}), ids(All(t, s)))
	_, err = s.Get(ctx, oldResolved.ID)
	require.ErrorIs(t, err, deadletter.ErrNotFound)

	n, err = s.Purge(ctx, deadletter.PurgeOptions{OlderThan: time.Hour, Now: now})
	require.NoError(t, err)
	require.Zero(t, n, "purging again finds nothing")

	n, err = s.Purge(ctx, deadletter.PurgeOptions{OlderThan: time.Hour, Now: now, IncludeUnresolved: true})
	require.NoError(t, err)
	require.Equal(t, 2, n, "IncludeUnresolved also takes old failed and replayed records")
	require.Equal(t, ids([]deadletter.Record{newResolved, newFailed}), ids(All(t, s)))

	// The boundary: a record exactly OlderThan old stays.
	n, err = s.Purge(ctx, deadletter.PurgeOptions{OlderThan: 30 * time.Minute, Now: now, IncludeUnresolved: true})
	require.NoError(t, err)
	require.Zero(t, n)

	// A failure of a purged record's event starts a new record.
	r := add(t, s, EventEntry("tickets", oldFailed.FailingEvent.ID, now))
	require.NotEqual(t, oldFailed.ID, r.ID)
	require.Equal(t, 1, r.Count)

	// Now defaults to the time of the call.
	n, err = s.Purge(ctx, deadletter.PurgeOptions{})
	require.NoError(t, err)
	require.Equal(t, 1, n, "newResolved is in the past")
	require.Equal(t, ids([]deadletter.Record{newFailed, r}), ids(All(t, s)))
}

func testReplay(t *testing.T, s deadletter.Store) {
	ctx := context.Background()
	a1 := add(t, s, EventEntry("alpha", uuid.New(), Base()))
	a2 := add(t, s, InvalidEntry("alpha", "msg-1", Base()))
	b1 := add(t, s, EventEntry("beta", uuid.New(), Base()))
	b2 := replayed(t, s, EventEntry("beta", uuid.New(), Base()))
	c1 := resolved(t, s, EventEntry("gamma", uuid.New(), Base()))
	before := All(t, s)

	pub := &Publisher{}
	now := Base().Add(time.Hour)
	res, err := deadletter.Replay(ctx, s, pub, deadletter.ReplayFilter{Projection: "alpha"}, "ann", now)
	require.NoError(t, err)
	require.Equal(t, deadletter.ReplayResult{Replayed: 2, Projections: []string{"alpha"}}, res)
	require.Equal(t, []trigger.Trigger{{Projection: "alpha", Reason: trigger.ReasonReplay, At: now}}, pub.Triggers(),
		"one trigger for the projection, addressed to it only, however many records it has")
	for _, id := range []int64{a1.ID, a2.ID} {
		r := get(t, s, id)
		require.Equal(t, deadletter.StatusReplayed, r.Status)
		require.Equal(t, "ann", r.ReplayedBy)
		require.Equal(t, now, r.ReplayedAt)
		require.Equal(t, 1, r.Replays)
	}
	after := All(t, s)
	require.Equal(t, stableAll(before[2:]), stableAll(after[2:]), "other projections' records are untouched")

	// The trigger is a valid one the worker accepts.
	payload, err := pub.Triggers()[0].Encode()
	require.NoError(t, err)
	decoded, err := trigger.Decode(payload)
	require.NoError(t, err)
	require.Equal(t, "alpha", decoded.Projection)
	require.Equal(t, trigger.ReasonReplay, decoded.Reason)

	pub = &Publisher{}
	later := now.Add(time.Hour)
	res, err = deadletter.Replay(ctx, s, pub, deadletter.ReplayFilter{All: true}, "bob", later)
	require.NoError(t, err)
	require.Equal(t, deadletter.ReplayResult{Replayed: 4, Projections: []string{"alpha", "beta"}}, res,
		"replayed records are replayed again; resolved ones are not")
	require.Equal(t, []string{"alpha", "beta"}, pub.Projections())
	for _, tr := range pub.Triggers() {
		require.Equal(t, trigger.ReasonReplay, tr.Reason)
		require.Equal(t, later, tr.At)
		require.True(t, tr.Position.IsZero())
	}
	require.Equal(t, 2, get(t, s, a1.ID).Replays)
	require.Equal(t, 1, get(t, s, b1.ID).Replays)
	require.Equal(t, 2, get(t, s, b2.ID).Replays)
	require.Equal(t, stable(c1), stable(get(t, s, c1.ID)))
}

func testReplayNothingToDo(t *testing.T, s deadletter.Store) {
	ctx := context.Background()
	pub := &Publisher{}
	res, err := deadletter.Replay(ctx, s, pub, deadletter.ReplayFilter{All: true}, "ann", Base())
	require.NoError(t, err, "replaying an empty store is harmless")
	require.Equal(t, deadletter.ReplayResult{}, res)

	resolved(t, s, EventEntry("quiet", uuid.New(), Base()))
	add(t, s, EventEntry("busy", uuid.New(), Base()))
	before := All(t, s)
	for _, name := range []string{"quiet", "never-failed"} {
		res, err := deadletter.Replay(ctx, s, pub, deadletter.ReplayFilter{Projection: name}, "ann", Base())
		require.NoError(t, err)
		require.Equal(t, deadletter.ReplayResult{}, res)
	}
	require.Empty(t, pub.Triggers(), "a projection with nothing to replay gets no trigger")
	require.Equal(t, before, All(t, s), "nothing changed")
}

// pageCounter is a Store that checks the pages Replay asks for.
type pageCounter struct {
	deadletter.Store
	t        testing.TB
	pageSize int
	mu       sync.Mutex
	lists    int
	marks    int
}

func (p *pageCounter) List(ctx context.Context, f deadletter.Filter) ([]deadletter.Record, error) {
	p.mu.Lock()
	p.lists++
	p.mu.Unlock()
	assert.Equal(p.t, p.pageSize, f.Limit, "Replay lists a page at a time")
	return p.Store.List(ctx, f)
}

func (p *pageCounter) MarkReplayed(ctx context.Context, ids []int64, by string, at time.Time) (int, error) {
	p.mu.Lock()
	p.marks++
	p.mu.Unlock()
	assert.LessOrEqual(p.t, len(ids), p.pageSize, "Replay marks a page at a time")
	return p.Store.MarkReplayed(ctx, ids, by, at)
}

func testReplayAllBounded(t *testing.T, s deadletter.Store) {
	ctx := context.Background()
	names := []string{"alpha", "beta", "gamma"}
	for i := range 21 {
		add(t, s, EventEntry(names[i%3], uuid.New(), Base()))
	}
	done := resolved(t, s, EventEntry("delta", uuid.New(), Base()))
	resolved(t, s, EventEntry("alpha", uuid.New(), Base()))

	counter := &pageCounter{Store: s, t: t, pageSize: 4}
	pub := &Publisher{}
	now := Base().Add(time.Hour)
	res, err := deadletter.Replay(ctx, counter, pub, deadletter.ReplayFilter{All: true, PageSize: 4}, "ann", now)
	require.NoError(t, err)
	require.Equal(t, deadletter.ReplayResult{Replayed: 21, Projections: names}, res)
	require.Equal(t, names, pub.Projections(), "one trigger per projection across all pages")
	require.Equal(t, 6, counter.lists, "21 records in pages of 4: five full pages and one of 1")
	require.Equal(t, 6, counter.marks)
	first := All(t, s)
	for _, r := range first {
		if r.Status == deadletter.StatusResolved {
			continue
		}
		require.Equal(t, deadletter.StatusReplayed, r.Status)
		require.Equal(t, 1, r.Replays)
	}

	// Again: triggers again; the records only count another replay.
	pub = &Publisher{}
	later := now.Add(time.Minute)
	res, err = deadletter.Replay(ctx, s, pub, deadletter.ReplayFilter{All: true, PageSize: 4}, "ann", later)
	require.NoError(t, err)
	require.Equal(t, deadletter.ReplayResult{Replayed: 21, Projections: names}, res)
	require.Equal(t, names, pub.Projections())
	second := All(t, s)
	require.Len(t, second, len(first))
	for i, r := range second {
		want := stable(first[i])
		if r.Status != deadletter.StatusResolved {
			want.Replays, want.ReplayedAt = 2, later
		}
		require.Equal(t, want, stable(r))
	}
	require.Equal(t, stable(done), stable(get(t, s, done.ID)))

	// The default page size replays everything too.
	pub = &Publisher{}
	res, err = deadletter.Replay(ctx, s, pub, deadletter.ReplayFilter{All: true}, "ann", later)
	require.NoError(t, err)
	require.Equal(t, 21, res.Replayed)
	require.Equal(t, names, pub.Projections())
}

func testReplayIDs(t *testing.T, s deadletter.Store) {
	ctx := context.Background()
	a := add(t, s, EventEntry("alpha", uuid.New(), Base()))
	b := replayed(t, s, EventEntry("beta", uuid.New(), Base()))
	c := resolved(t, s, EventEntry("alpha", uuid.New(), Base()))
	bystander := add(t, s, EventEntry("alpha", uuid.New(), Base()))
	before := All(t, s)

	pub := &Publisher{}
	_, err := deadletter.Replay(ctx, s, pub, deadletter.ReplayFilter{IDs: []int64{a.ID, 99999}}, "ann", Base())
	require.ErrorIs(t, err, deadletter.ErrNotFound)
	require.ErrorContains(t, err, "99999")
	require.ErrorContains(t, err, "nothing was replayed")
	require.Empty(t, pub.Triggers())
	require.Equal(t, before, All(t, s), "an unknown ID changes nothing")

	now := Base().Add(time.Hour)
	res, err := deadletter.Replay(ctx, s, pub, deadletter.ReplayFilter{IDs: []int64{b.ID, c.ID, a.ID, a.ID}}, "ann", now)
	require.NoError(t, err)
	require.Equal(t, deadletter.ReplayResult{Replayed: 2, Skipped: 1, Projections: []string{"alpha", "beta"}}, res)
	require.Equal(t, []string{"alpha", "beta"}, pub.Projections())
	require.Equal(t, deadletter.StatusReplayed, get(t, s, a.ID).Status)
	require.Equal(t, 2, get(t, s, b.ID).Replays)
	require.Equal(t, stable(c), stable(get(t, s, c.ID)))
	require.Equal(t, stable(bystander), stable(get(t, s, bystander.ID)), "records not named are untouched")

	pub = &Publisher{}
	res, err = deadletter.Replay(ctx, s, pub, deadletter.ReplayFilter{IDs: []int64{c.ID}}, "ann", now)
	require.NoError(t, err)
	require.Equal(t, deadletter.ReplayResult{Skipped: 1}, res)
	require.Empty(t, pub.Triggers(), "only resolved records named: no trigger")
}

func testReplayRefuses(t *testing.T, s deadletter.Store) {
	ctx := context.Background()
	add(t, s, EventEntry("alpha", uuid.New(), Base()))
	before := All(t, s)
	pub := &Publisher{}

	_, err := deadletter.Replay(ctx, s, pub, deadletter.ReplayFilter{}, "ann", Base())
	require.ErrorIs(t, err, deadletter.ErrInvalidFilter)
	for _, word := range []string{"empty", "IDs", "Projection", "All"} {
		require.ErrorContains(t, err, word)
	}
	for _, f := range []deadletter.ReplayFilter{
		{All: true, Projection: "alpha"},
		{IDs: []int64{1}, All: true},
		{IDs: []int64{1}, Projection: "alpha"},
		{Projection: "Alpha!"},
		{IDs: []int64{0}},
		{All: true, PageSize: -1},
		{All: true, PageSize: deadletter.ListLimitMax + 1},
	} {
		_, err := deadletter.Replay(ctx, s, pub, f, "ann", Base())
		require.ErrorIs(t, err, deadletter.ErrInvalidFilter, "%+v", f)
	}
	_, err = deadletter.Replay(ctx, s, pub, deadletter.ReplayFilter{All: true}, " ", Base())
	require.ErrorIs(t, err, deadletter.ErrInvalidInput)
	require.ErrorContains(t, err, "who")
	_, err = deadletter.Replay(ctx, s, nil, deadletter.ReplayFilter{All: true}, "ann", Base())
	require.ErrorIs(t, err, deadletter.ErrInvalidInput)
	_, err = deadletter.Replay(ctx, nil, pub, deadletter.ReplayFilter{All: true}, "ann", Base())
	require.ErrorIs(t, err, deadletter.ErrInvalidInput)

	require.Empty(t, pub.Triggers())
	require.Equal(t, before, All(t, s), "a refused replay changes nothing")
}

func testConcurrentAdds(t *testing.T, s deadletter.Store) {
	const (
		workers = 8
		rounds  = 5
	)
	event := uuid.New()
	var (
		wg     sync.WaitGroup
		start  = make(chan struct{})
		mu     sync.Mutex
		seenID = map[int64]bool{}
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := range rounds {
				e := EventEntry("tickets", event, Base().Add(time.Duration(w*rounds+i)*time.Second))
				e.Attempts = 2
				r, err := s.Add(context.Background(), e)
				if !assert.NoError(t, err) {
					return
				}
				mu.Lock()
				seenID[r.ID] = true
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()

	require.Len(t, seenID, 1, "every Add folded into one record")
	all := All(t, s)
	require.Len(t, all, 1)
	r := all[0]
	require.Equal(t, workers*rounds, r.Count)
	require.Equal(t, 2*workers*rounds, r.Attempts)
	require.Equal(t, Base(), r.FirstFailedAt)
	require.Equal(t, Base().Add(time.Duration(workers*rounds-1)*time.Second), r.LastFailedAt)
}

func testBadInput(t *testing.T, s deadletter.Store) {
	ctx := context.Background()
	valid := EventEntry("tickets", uuid.New(), Base())
	for name, mutate := range map[string]func(e *deadletter.Entry){
		"no projection":       func(e *deadletter.Entry) { e.Projection = "" },
		"bad projection":      func(e *deadletter.Entry) { e.Projection = "Tickets; DROP TABLE" },
		"failing event no id": func(e *deadletter.Entry) { e.FailingEvent.ID = uuid.Nil },
		"negative attempts":   func(e *deadletter.Entry) { e.Attempts = -1 },
	} {
		e := valid
		fe := *valid.FailingEvent
		e.FailingEvent = &fe
		mutate(&e)
		_, err := s.Add(ctx, e)
		require.ErrorIs(t, err, deadletter.ErrInvalidInput, name)
	}
	_, err := s.Add(ctx, deadletter.Entry{Projection: "tickets", FailingEvent: &eventstore.EventRef{}})
	require.ErrorContains(t, err, "leave FailingEvent nil")
	require.Empty(t, All(t, s), "a refused entry writes nothing")

	r := add(t, s, valid)
	_, err = s.MarkReplayed(ctx, []int64{r.ID}, "", Base())
	require.ErrorIs(t, err, deadletter.ErrInvalidInput)
	require.ErrorContains(t, err, "who")
	err = s.Resolve(ctx, r.ID, "\x00 ", "note", Base())
	require.ErrorIs(t, err, deadletter.ErrInvalidInput)
	_, err = s.Purge(ctx, deadletter.PurgeOptions{OlderThan: -time.Hour, IncludeUnresolved: true})
	require.ErrorIs(t, err, deadletter.ErrInvalidFilter)
	require.Equal(t, r, get(t, s, r.ID), "refused calls change nothing")
}
