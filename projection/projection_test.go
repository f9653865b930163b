package projection_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/name"
	"github.com/nudgeworks/nudge/projection"
)

type ticket struct {
	ID string `json:"id"`
}

func noop(context.Context, projection.Event[ticket]) error { return nil }

func TestNewRefusesBadDefinitions(t *testing.T) {
	t.Parallel()
	_, err := projection.New("Bad Name", projection.Config{}, projection.OnIdempotent("A", noop))
	require.ErrorIs(t, err, name.ErrInvalid)
	var ne *name.Error
	require.ErrorAs(t, err, &ne)
	require.Equal(t, "Bad Name", ne.Name)

	cases := map[string]struct {
		cfg      projection.Config
		handlers []projection.Handler
	}{
		"no handlers":                      {projection.Config{}, nil},
		"two handlers for event type A":    {projection.Config{}, []projection.Handler{projection.OnIdempotent("A", noop), projection.OnIdempotent("A", noop)}},
		"BatchSize -1 out of range":        {projection.Config{BatchSize: -1}, []projection.Handler{projection.OnIdempotent("A", noop)}},
		"BatchSize 10001 out of range":     {projection.Config{BatchSize: eventstore.ReadLimitMax + 1}, []projection.Handler{projection.OnIdempotent("A", noop)}},
		"MaxBatchDuration -1s is negative": {projection.Config{MaxBatchDuration: -1e9}, []projection.Handler{projection.OnIdempotent("A", noop)}},
		"nil function":                     {projection.Config{}, []projection.Handler{projection.OnIdempotent[ticket]("A", nil)}},
		"event type":                       {projection.Config{}, []projection.Handler{projection.OnIdempotent("", noop)}},
	}
	for want, tc := range cases {
		_, err := projection.New("tickets", tc.cfg, tc.handlers...)
		require.ErrorIs(t, err, projection.ErrInvalidConfig, want)
		require.ErrorContains(t, err, want)
		require.ErrorContains(t, err, "projection tickets")
	}
}

func TestProjectionDefaultsAndHandle(t *testing.T) {
	t.Parallel()
	var got []string
	p, err := projection.New("tickets", projection.Config{},
		projection.OnIdempotent("TicketWasRegistered", func(_ context.Context, e projection.Event[ticket]) error {
			got = append(got, e.Data.ID)
			return nil
		}),
		projection.On("TicketWasClosed", func(context.Context, pgx.Tx, projection.Event[ticket]) error { return nil }))
	require.NoError(t, err)
	require.Equal(t, projection.BatchSizeDefault, p.Config().BatchSize)
	require.Equal(t, projection.MaxBatchDurationDefault, p.Config().MaxBatchDuration)
	require.Equal(t, []string{"TicketWasClosed", "TicketWasRegistered"}, p.Types())
	require.True(t, p.Transactional())

	ctx := context.Background()
	require.NoError(t, p.Handle(ctx, nil, eventstore.Event{Type: "TicketWasRegistered", Payload: []byte(`{"id":"t-1"}`)}))
	require.NoError(t, p.Handle(ctx, nil, eventstore.Event{Type: "SomethingElse", Payload: []byte(`{}`)}), "other types are ignored")
	require.Equal(t, []string{"t-1"}, got)

	err = p.Handle(ctx, nil, eventstore.Event{Type: "TicketWasRegistered", Payload: []byte(`{"id": 7}`)})
	require.ErrorIs(t, err, projection.ErrHandler)
	require.ErrorIs(t, err, projection.ErrDecode)
	require.ErrorContains(t, err, "projection tickets: handling event")
	require.ErrorContains(t, err, "does not decode into projection_test.ticket")
}

func TestNewRunnerRefusesBadSets(t *testing.T) {
	t.Parallel()
	p, err := projection.New("tickets", projection.Config{}, projection.OnIdempotent("A", noop))
	require.NoError(t, err)
	var backend projection.Backend = struct{ projection.Backend }{}
	_, err = projection.NewRunner(nil, projection.RunnerConfig{}, p)
	require.ErrorIs(t, err, projection.ErrInvalidConfig)
	_, err = projection.NewRunner(backend, projection.RunnerConfig{})
	require.ErrorIs(t, err, projection.ErrInvalidConfig)
	_, err = projection.NewRunner(backend, projection.RunnerConfig{}, p, nil)
	require.ErrorIs(t, err, projection.ErrInvalidConfig)
	_, err = projection.NewRunner(backend, projection.RunnerConfig{}, p, p)
	require.ErrorIs(t, err, projection.ErrInvalidConfig)
	require.ErrorContains(t, err, "two projections are named tickets")

	r, err := projection.NewRunner(backend, projection.RunnerConfig{}, p)
	require.NoError(t, err)
	_, err = projection.NewPoller(r, projection.PollerConfig{MinInterval: 10e9, MaxInterval: 1e9})
	require.ErrorIs(t, err, projection.ErrInvalidConfig)
	_, err = projection.NewPoller(r, projection.PollerConfig{}, "nope")
	require.ErrorIs(t, err, projection.ErrUnknownProjection)
}

func TestParseState(t *testing.T) {
	t.Parallel()
	for _, s := range projection.States() {
		got, err := projection.ParseState(string(s))
		require.NoError(t, err)
		require.Equal(t, s, got)
	}
	_, err := projection.ParseState("sleeping")
	require.ErrorIs(t, err, projection.ErrUnknownState)
	require.ErrorContains(t, err, `"sleeping"`)
}

func TestStatusProgress(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	st := projection.Status{State: projection.StateRebuilding, RebuildStartedAt: start, EventsProcessed: 3000, LagEvents: 1000}
	require.InDelta(t, 1500.0, st.EventsPerSecond(start.Add(2*time.Second)), 0.001)
	done, total := st.Progress()
	require.Equal(t, int64(3000), done)
	require.Equal(t, int64(4000), total)
	require.False(t, st.CaughtUp())
	st.State = projection.StateRunning
	require.Zero(t, st.EventsPerSecond(start.Add(2*time.Second)), "a rate only while rebuilding")
}
