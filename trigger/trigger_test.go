package trigger_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/trigger"
)

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	in := trigger.Trigger{
		Position: eventstore.Position{TransactionID: 7414, GlobalPosition: 1203},
		StreamID: "ticket-42",
		Types:    []string{"TicketWasRegistered", "TicketWasClosed"},
		Keys:     []uint32{7, 2147483647},
		At:       time.Date(2026, 11, 22, 10, 0, 0, 123, time.UTC),
		Reason:   trigger.ReasonAppend,
	}
	msg, err := trigger.NewMessage(in)
	require.NoError(t, err)
	require.Equal(t, "1", msg.Metadata.Get(trigger.MetadataKey))
	require.Less(t, len(msg.Payload), 256, "a trigger is small")
	out, err := trigger.FromMessage(msg)
	require.NoError(t, err)
	require.Equal(t, in, out)
}

// TestCatchUpTriggers: a trigger without a reason, or with a catch-up reason of older builds
// ("tick", "startup") still waiting in a durable queue, is an append trigger; without a
// position it means "catch up to the end".
func TestCatchUpTriggers(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`{"v":1,"at":"2026-11-22T10:00:00Z"}`,
		`{"v":1,"at":"2026-11-22T10:00:00Z","reason":""}`,
		`{"v":1,"at":"2026-11-22T10:00:00Z","reason":"tick"}`,
		`{"v":1,"at":"2026-11-22T10:00:00Z","reason":"startup"}`,
	} {
		tr, err := trigger.Decode([]byte(in))
		require.NoError(t, err, in)
		require.Equal(t, trigger.Trigger{At: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC), Reason: trigger.ReasonAppend}, tr, in)
	}
	b, err := trigger.Trigger{}.Encode()
	require.NoError(t, err)
	require.Contains(t, string(b), `"reason":"append"`, "a trigger without a reason is sent as what it means")

	_, err = trigger.Trigger{Reason: "later"}.Encode()
	require.ErrorContains(t, err, `unknown reason "later"`, "a reason no consumer knows is refused at the sender")
	_, err = trigger.NewMessage(trigger.Trigger{Reason: "later"})
	require.Error(t, err)
}

func TestEncodeDropsTypesThatDoNotFit(t *testing.T) {
	t.Parallel()
	var types []string
	for i := range 100 {
		types = append(types, strings.Repeat("T", 20)+string(rune('a'+i%26)))
	}
	b, err := trigger.Trigger{Types: types, StreamID: strings.Repeat("s", 255)}.Encode()
	require.NoError(t, err)
	require.LessOrEqual(t, len(b), trigger.MaxSize)
	got, err := trigger.Decode(b)
	require.NoError(t, err)
	require.Empty(t, got.Types, "no type list means any type")
	require.True(t, got.Concerns([]string{"Anything"}))
}

// TestEncodeDropsKeysBeforeTypes: a trigger too large with its partition keys loses them
// (any stream) and keeps its types if they fit.
func TestEncodeDropsKeysBeforeTypes(t *testing.T) {
	t.Parallel()
	keys := make([]uint32, trigger.MaxKeys)
	for i := range keys {
		keys[i] = 2147483600 + uint32(i) //nolint:gosec // small
	}
	b, err := trigger.Trigger{Types: []string{"A"}, Keys: keys, StreamID: strings.Repeat("s", 255)}.Encode()
	require.NoError(t, err)
	require.LessOrEqual(t, len(b), trigger.MaxSize)
	got, err := trigger.Decode(b)
	require.NoError(t, err)
	require.Empty(t, got.Keys, "no keys means any stream")
	require.Equal(t, []string{"A"}, got.Types)
	require.True(t, got.ConcernsPartition(eventstore.Partition{Index: 3, Count: 16}))
}

// TestConcernsPartition: a trigger concerns the partitions its streams' keys fall in; one
// without keys concerns every partition; an unpartitioned projection, every trigger.
func TestConcernsPartition(t *testing.T) {
	t.Parallel()
	res := eventstore.AppendResult{Events: []eventstore.Event{{StreamID: "order-42", Type: "A"}}}
	tr := trigger.ForAppend(res, time.Now())
	require.Equal(t, []uint32{eventstore.PartitionKey("order-42")}, tr.Keys)
	for k := range 16 {
		require.Equal(t, k == eventstore.PartitionOf("order-42", 16), tr.ConcernsPartition(eventstore.Partition{Index: k, Count: 16}), "partition %d", k)
	}
	require.True(t, tr.ConcernsPartition(eventstore.Partition{}))
	require.True(t, trigger.Trigger{}.ConcernsPartition(eventstore.Partition{Index: 1, Count: 16}))
}

func TestConcerns(t *testing.T) {
	t.Parallel()
	tr := trigger.Trigger{Types: []string{"A", "B"}}
	require.True(t, tr.Concerns([]string{"B", "C"}))
	require.False(t, tr.Concerns([]string{"C"}))
	require.True(t, trigger.Trigger{}.Concerns([]string{"C"}))
	require.True(t, tr.Concerns(nil), "a projection of every type is concerned by everything")
}

func TestDecodeRefusesWithReasons(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"":                          "not a JSON trigger object",
		"\x00\xff garbage":          "not a JSON trigger object",
		`{"v":1,"pos":"7414/`:       "not a JSON trigger object",
		`[1,2,3]`:                   "not a JSON trigger object",
		`{"pos":"1/2"}`:             `no version field "v"`,
		`{"v":2,"pos":"1/2"}`:       "version 2; this build reads version 1",
		`{"v":"1"}`:                 "not a JSON trigger object",
		`{"v":1,"pos":"one/two"}`:   "bad position",
		`{"v":1} {"v":1}`:           "trailing data",
		`{"v":1,"at":"yesterday"}`:  "not a JSON trigger object",
		`{"v":1,"types":"A"}`:       "not a JSON trigger object",
		`{"v":1,"reason":"later"}`:  `unknown reason "later"; this build knows ["append" "replay" "skip" "rebuild" "redrive"]`,
		`{"v":1,"reason":"Append"}`: `unknown reason "Append"`,
		`{"v":1,"stream":"` + strings.Repeat("x", trigger.MaxSize) + `"}`: "more than the 1024",
	}
	for in, reason := range cases {
		_, err := trigger.Decode([]byte(in))
		require.ErrorIs(t, err, trigger.ErrInvalid, in)
		require.ErrorContains(t, err, reason, in)
		var de *trigger.DecodeError
		require.True(t, errors.As(err, &de), in)
	}
	skip := trigger.Trigger{Projection: "ticket_list", Reason: trigger.ReasonSkip,
		Skip: &trigger.SkipRequest{EventID: uuid.New(), Reason: "bad data", By: "ann"}}
	b, err := skip.Encode()
	require.NoError(t, err)
	back, err := trigger.Decode(b)
	require.NoError(t, err)
	require.Equal(t, skip.Skip, back.Skip)
	for _, bad := range []string{`{"v":1,"reason":"skip","for":"p"}`, `{"v":1,"reason":"skip","skip":{"event":"` + uuid.NewString() + `"}}`} {
		_, err = trigger.Decode([]byte(bad))
		require.ErrorIs(t, err, trigger.ErrInvalid, bad)
	}
	rebuild := trigger.Trigger{Projection: "ticket_list", Reason: trigger.ReasonRebuild,
		At: time.Date(2026, 11, 22, 10, 0, 0, 123456000, time.UTC), Rebuild: &trigger.RebuildRequest{By: "ann"}}
	b, err = rebuild.Encode()
	require.NoError(t, err)
	back, err = trigger.Decode(b)
	require.NoError(t, err)
	require.Equal(t, rebuild, back, "the request time keeps its microseconds")
	bare, err := trigger.Decode([]byte(`{"v":1,"reason":"rebuild","for":"p","at":"2026-11-22T10:00:00Z"}`))
	require.NoError(t, err, "the request's details are optional")
	require.Nil(t, bare.Rebuild)
	for _, bad := range []string{
		`{"v":1,"reason":"rebuild","at":"2026-11-22T10:00:00Z","rebuild":{"by":"ann"}}`, // for no projection
		`{"v":1,"reason":"rebuild","for":"p","rebuild":{"by":"ann"}}`,                   // no request time
		`{"v":1,"reason":"rebuild","for":"p","at":"0001-01-01T00:00:00Z"}`,
	} {
		_, err = trigger.Decode([]byte(bad))
		require.ErrorIs(t, err, trigger.ErrInvalid, bad)
		require.ErrorContains(t, err, `a rebuild trigger needs "for" and the request time "at"`, bad)
	}
	redrive := trigger.Trigger{Projection: "ticket_list", Reason: trigger.ReasonRedrive, At: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC),
		Redrive: &trigger.RedriveRequest{Stream: "ticket-6", By: "ann"}}
	b, err = redrive.Encode()
	require.NoError(t, err)
	back, err = trigger.Decode(b)
	require.NoError(t, err)
	require.Equal(t, redrive, back)
	for _, bad := range []string{
		`{"v":1,"reason":"redrive","redrive":{"by":"ann"}}`, // for no projection
		`{"v":1,"reason":"redrive","for":"p"}`,              // no request
	} {
		_, err = trigger.Decode([]byte(bad))
		require.ErrorIs(t, err, trigger.ErrInvalid, bad)
		require.ErrorContains(t, err, `a redrive trigger needs "for" and "redrive"`, bad)
	}
	_, err = trigger.Decode([]byte(`{"v":9}`))
	require.ErrorIs(t, err, trigger.ErrUnsupportedVersion)
	_, err = trigger.Decode([]byte(`{}`))
	require.NotErrorIs(t, err, trigger.ErrUnsupportedVersion)
}

// FuzzDecode: no input crashes the decoder; whatever decodes encodes and decodes to the same
// trigger; whatever fails, fails as ErrInvalid.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"v":1,"pos":"7414/1203","stream":"s","types":["A"],"at":"2026-11-22T10:00:00Z","reason":"append"}`))
	f.Add([]byte(`{"v":1,"for":"ticket_list","reason":"replay","at":"2026-11-22T10:00:00Z"}`))
	f.Add([]byte(`{"v":1,"for":"ticket_list","reason":"rebuild","at":"2026-11-22T10:00:00.123456Z","rebuild":{"by":"ann"}}`))
	f.Add([]byte(`{"v":1,"for":"ticket_list","reason":"rebuild"}`))
	f.Add([]byte(`{"v":1,"at":"2026-11-22T10:00:00Z","reason":"tick"}`))
	f.Add([]byte(`{"v":1,"reason":"later"}`))
	f.Add([]byte(`{"v":2}`))
	f.Add([]byte(`{"v":1,"pos":"-1/2"}`))
	f.Add([]byte("\x00\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		tr, err := trigger.Decode(b)
		if err != nil {
			if !errors.Is(err, trigger.ErrInvalid) {
				t.Fatalf("error %v does not match ErrInvalid", err)
			}
			return
		}
		if !slices.Contains(trigger.Reasons(), tr.Reason) {
			t.Fatalf("decoded reason %q is not one of %q", tr.Reason, trigger.Reasons())
		}
		again, err := tr.Encode()
		if err != nil {
			t.Fatalf("decoded trigger does not encode: %v", err)
		}
		back, err := trigger.Decode(again)
		if err != nil {
			t.Fatalf("re-encoded trigger does not decode: %v", err)
		}
		if !back.At.Equal(tr.At) || back.Position != tr.Position || back.StreamID != tr.StreamID || back.Projection != tr.Projection ||
			back.Reason != tr.Reason || (back.Rebuild == nil) != (tr.Rebuild == nil) {
			t.Fatalf("round trip changed the trigger: %+v → %+v", tr, back)
		}
	})
}
