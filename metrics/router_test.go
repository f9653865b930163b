package metrics_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/metrics"
	"github.com/nudgeworks/nudge/trigger"
	"github.com/nudgeworks/nudge/worker"
)

// TestRouterMetrics: Watermill's router metrics, added to a router of the test's own that runs
// the worker's handlers, appear on the same registry with the namespace and a projection
// label once a trigger was handled.
func TestRouterMetrics(t *testing.T) {
	t.Parallel()
	e := newMemoryEnv(t)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: testwait.For(time.Minute)}, watermill.NewSlogLogger(testlog.New(t)))
	require.NoError(t, err)
	require.NoError(t, e.m.AddRouterMetrics(router))
	require.ErrorIs(t, e.m.AddRouterMetrics(router), metrics.ErrAlreadyRegistered, "twice on one router would count twice")
	require.NoError(t, e.worker.Prepare(context.Background()))
	require.NoError(t, e.worker.AddHandlers(router))

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := router.Run(ctx); err != nil {
			t.Errorf("router: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	<-router.Running()

	res := e.append(t, "Registered", 1)
	require.NoError(t, e.ch.Publish(context.Background(), trigger.ForAppend(res, time.Now())))
	e.eventually(t, "the handlers' executions are timed", func() bool {
		good, _ := value(t, e.reg, "nudge_router_handler_execution_time_seconds", "handler_name", "nudge.good", "projection", "good", "success", "true")
		broken, _ := value(t, e.reg, "nudge_router_handler_execution_time_seconds", "handler_name", "nudge.broken", "projection", "broken", "success", "true")
		return good == 1 && broken == 1
	})
	e.eventually(t, "the subscribers' messages are counted once acked", func() bool {
		v, _ := value(t, e.reg, "nudge_router_subscriber_messages_received_total", "handler_name", "nudge.good", "projection", "good", "acked", "acked")
		return v == 1
	})
	require.Equal(t, 1.0, mustValue(t, e.reg, "nudge_projection_events_projected_total", "projection", "good"))
}

// TestRouterMetricsViaRouterFunc: worker.Run's own router gets the metrics through
// Config.RouterFunc.
func TestRouterMetricsViaRouterFunc(t *testing.T) {
	t.Parallel()
	e := newMemoryEnv(t, func(cfg *worker.Config, m *metrics.Metrics) { cfg.RouterFunc = m.AddRouterMetrics })
	e.run(t)
	res := e.append(t, "Registered", 1)
	require.NoError(t, e.ch.Publish(context.Background(), trigger.ForAppend(res, time.Now())))
	e.eventually(t, "the handler's execution is timed", func() bool {
		v, _ := value(t, e.reg, "nudge_router_handler_execution_time_seconds", "handler_name", "nudge.good", "projection", "good", "success", "true")
		return v == 1
	})
}

// TestRouterMetricsOnTwoRouters: one Metrics can instrument several routers; Watermill reuses
// the collectors already registered.
func TestRouterMetricsOnTwoRouters(t *testing.T) {
	t.Parallel()
	m, _ := newMetrics(t)
	for range 2 {
		router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
		require.NoError(t, err)
		require.NoError(t, m.AddRouterMetrics(router))
	}
	require.ErrorIs(t, m.AddRouterMetrics(nil), metrics.ErrInvalidConfig)
}

// TestRouterMetricsConflict: a Registerer that refuses Watermill's histogram gives an error,
// not Watermill's panic.
func TestRouterMetricsConflict(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "nudge_router_handler_execution_time_seconds", Help: "squatter"}))
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	err = m.AddRouterMetrics(router)
	require.Error(t, err)
	require.Contains(t, err.Error(), "handler execution time")
	require.NotErrorIs(t, err, metrics.ErrAlreadyRegistered)
}
