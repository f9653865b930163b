package worker

import (
	"strings"

	"github.com/ThreeDotsLabs/watermill"
)

// HandlerPrefix starts the name of every router handler the worker adds: "nudge." + the
// projection's name. Router-level middleware and metrics can tell a projection by it.
const HandlerPrefix = "nudge."

// routerLogger tags the router's log lines about a worker handler with the handler's
// projection, so that every line about a projection carries its name, the router's too.
type routerLogger struct{ watermill.LoggerAdapter }

// RouterLogger wraps a router's logger so that its lines about the worker's handlers (the
// handler names starting with HandlerPrefix) carry "projection", like every other line about a
// projection; lines about other handlers pass unchanged. Run's router uses it; give it to your
// router when you use AddHandlers:
//
//	router, err := message.NewRouter(cfg, worker.RouterLogger(watermill.NewSlogLogger(logger)))
func RouterLogger(inner watermill.LoggerAdapter) watermill.LoggerAdapter {
	if _, ok := inner.(routerLogger); ok {
		return inner
	}
	return routerLogger{inner}
}

// withProjection adds "projection" to fields that name one of the worker's handlers (the
// router calls a handler's subscriber by the handler's name too).
func withProjection(fields watermill.LogFields) watermill.LogFields {
	name, ok := fields["handler_name"].(string)
	if !ok {
		name, ok = fields["subscriber_name"].(string)
	}
	if !ok || !strings.HasPrefix(name, HandlerPrefix) {
		return fields
	}
	if _, set := fields["projection"]; set {
		return fields
	}
	return fields.Add(watermill.LogFields{"projection": strings.TrimPrefix(name, HandlerPrefix)})
}

func (l routerLogger) Error(msg string, err error, fields watermill.LogFields) {
	l.LoggerAdapter.Error(msg, err, withProjection(fields))
}

func (l routerLogger) Info(msg string, fields watermill.LogFields) {
	l.LoggerAdapter.Info(msg, withProjection(fields))
}

func (l routerLogger) Debug(msg string, fields watermill.LogFields) {
	l.LoggerAdapter.Debug(msg, withProjection(fields))
}

func (l routerLogger) Trace(msg string, fields watermill.LogFields) {
	l.LoggerAdapter.Trace(msg, withProjection(fields))
}

func (l routerLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return routerLogger{l.LoggerAdapter.With(withProjection(fields))}
}
