package metrics

import (
	"context"
	"fmt"
	"strings"

	wmetrics "github.com/ThreeDotsLabs/watermill/components/metrics"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/nudgeworks/nudge/worker"
)

// RouterSubsystem is the subsystem of Watermill's router metrics:
// <namespace>_router_handler_execution_time_seconds and so on.
const RouterSubsystem = "router"

// RouterHandlerBuckets returns the buckets of the router's handler-execution histogram, in
// seconds: a handler's time includes its retries' backoff, up to retry.Policy.MaxElapsedTime
// (20 s by default).
func RouterHandlerBuckets() []float64 {
	return []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
}

// AddRouterMetrics adds Watermill's Prometheus metrics (components/metrics) to router, on the
// same Registerer and namespace, with the subsystem RouterSubsystem and a projection label: a
// router-level middleware timing every handler, and decorators counting the messages its
// subscribers receive and timing its publishes. Call it before router.Run: pass it as
// worker.Config.RouterFunc, or call it next to worker.AddHandlers on a router of yours. Several
// routers may share one Metrics; adding the metrics twice to one router fails with an error
// matching ErrAlreadyRegistered.
//
// Watermill registers its collectors again for every router and reuses those already there.
// A Registerer that refuses them (a metric of the same name with other labels) makes
// AddRouterMetrics return the error, or, for the subscriber and publisher metrics, router.Run.
func (m *Metrics) AddRouterMetrics(router *message.Router) (err error) {
	if router == nil {
		return wrapInvalid("AddRouterMetrics needs a router, got nil")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.routers[router] {
		return fmt.Errorf("%w: the router metrics were already added to this router", ErrAlreadyRegistered)
	}
	b := wmetrics.NewPrometheusMetricsBuilderWithConfig(m.reg, wmetrics.PrometheusMetricsBuilderConfig{
		Namespace: m.ns, Subsystem: RouterSubsystem,
		AdditionalLabels: []wmetrics.MetricLabel{{Label: "projection", ComputeValueFn: projectionOfHandler}},
	})
	b.HandlerBuckets = RouterHandlerBuckets()
	// Watermill panics when the Registerer refuses its handler histogram.
	defer func() {
		if p := recover(); p != nil {
			cause, ok := p.(error)
			if !ok {
				cause = fmt.Errorf("%v", p)
			}
			err = fmt.Errorf("metrics: add Watermill's router metrics (namespace %q): %w", m.ns, cause)
		}
	}()
	mw := b.NewRouterMiddleware()
	router.AddPublisherDecorators(b.DecoratePublisher)
	router.AddSubscriberDecorators(b.DecorateSubscriber)
	router.AddMiddleware(mw.Middleware)
	m.routers[router] = true
	return nil
}

// projectionOfHandler returns the projection a worker's handler runs, from the message's
// context; empty for other handlers.
func projectionOfHandler(ctx context.Context) string {
	name, ok := strings.CutPrefix(message.HandlerNameFromCtx(ctx), worker.HandlerPrefix)
	if !ok {
		return ""
	}
	return name
}
