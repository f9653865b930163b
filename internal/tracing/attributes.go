package tracing

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Attribute keys of nudge's spans.
const (
	AttrProjection   = attribute.Key("nudge.projection")
	AttrProjections  = attribute.Key("nudge.projections")
	AttrStream       = attribute.Key("nudge.stream")
	AttrEvents       = attribute.Key("nudge.events")
	AttrPositionFrom = attribute.Key("nudge.position.from")
	AttrPositionTo   = attribute.Key("nudge.position.to")
	AttrOutcome      = attribute.Key("nudge.outcome")
	AttrLockWait     = attribute.Key("nudge.lock.wait_seconds")
	AttrLinks        = attribute.Key("nudge.links")
	AttrReason       = attribute.Key("nudge.trigger.reason")
	AttrIdempotent   = attribute.Key("nudge.idempotent")
	AttrVersion      = attribute.Key("nudge.version")
	AttrBy           = attribute.Key("nudge.by")
	AttrCount        = attribute.Key("nudge.count")
	// Messaging attributes of the broker hops, after OpenTelemetry's semantic conventions.
	AttrMessagingOperation = attribute.Key("messaging.operation.type")
	AttrMessagingMessageID = attribute.Key("messaging.message.id")
	AttrMessagingConsumer  = attribute.Key("messaging.consumer.group.name")
)

// Outcomes of a batch (AttrOutcome).
const (
	OutcomeCommitted = "committed"
	OutcomeEmpty     = "empty"
	OutcomeFailed    = "failed"
	OutcomePaused    = "paused"
	OutcomeRetired   = "retired"
	OutcomeCanceled  = "canceled"
)

// End ends span, marking it failed with err if err is not nil.
func End(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
