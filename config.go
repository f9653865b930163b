package nudge

//go:generate go run ./internal/docgen

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/metrics"
	"github.com/nudgeworks/nudge/postgres"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/relay"
	"github.com/nudgeworks/nudge/retry"
)

// ErrInvalidConfig is matched (errors.Is) by every error New and NewInMemory return for a Config
// they cannot use; the message names the field and what to do.
var ErrInvalidConfig = errors.New("nudge: invalid config")

// TriggerMode says how appends publish their triggers.
type TriggerMode string

const (
	// TriggersRelay: a relay in every Run tails the event store and publishes one coalesced
	// trigger per batch of appended events, on any channel. An append writes nothing more, and
	// events appended by other means (another service, SQL) are triggered too. The default.
	TriggersRelay TriggerMode = "relay"
	// TriggersInTransaction: Append and AppendTx publish the trigger in the append's transaction
	// (the PostgreSQL-queue channel, channel/postgres, only): no relay and no poll, so the
	// lowest latency. Such a trigger can arrive while an older transaction still holds the
	// store's readers back, so the client makes handlers wait for its position (up to
	// HorizonWait). Events appended by other means are caught up by the safety net only.
	TriggersInTransaction TriggerMode = "in_transaction"
)

// TriggerModes lists every TriggerMode.
func TriggerModes() []TriggerMode { return []TriggerMode{TriggersRelay, TriggersInTransaction} }

// Config configures a Client. Projections are required; every other field is optional.
type Config struct {
	// Channel carries the triggers: channel/amqp (RabbitMQ), channel/postgres (a PostgreSQL
	// queue) or channel/gochannel (in process). The client never closes it. Required to run
	// the projections (Run, RunRouter, AddHandlers) and with TriggersInTransaction. A process
	// that only appends, reads and reports status beside others that Run (an API) leaves it
	// nil: it opens no broker connection, and Run returns ErrNoChannel.
	Channel channel.Channel
	// Projections are the projections Run (or AddHandlers) runs, and whose status the client
	// reports. At least one is required; a process that only appends (an API) passes them too
	// and does not call Run.
	Projections []*projection.Projection
	// Schema holds nudge's tables (events, projection status, dead letters). Defaults to "",
	// the connection's search_path (usually public). Ignored by NewInMemory.
	Schema string
	// Logger receives every part's structured logs; each line about a projection carries
	// "projection". Defaults to slog.Default().
	Logger *slog.Logger
	// Triggers says how appends publish their triggers. Defaults to TriggersRelay.
	Triggers TriggerMode
	// DeadLetters keeps the triggers whose retries are over. Defaults to the PostgreSQL
	// dead-letter store in Schema (New) or an in-memory one (NewInMemory); `nudge deadletter`
	// sees the PostgreSQL one.
	DeadLetters deadletter.Store
	// Retry is the backoff for a failing trigger before it is dead-lettered; zero fields take
	// retry's defaults (5 attempts over about 3 s).
	Retry retry.Policy
	// Limits bound each append; zero fields take eventstore's defaults.
	Limits eventstore.Limits
	// SafetyNetInterval is how often the worker's safety net catches up, without a trigger,
	// every projection with events waiting (see worker.Config.SafetyNetInterval). Defaults to
	// worker.SafetyNetIntervalDefault (30 s); negative turns the tick off.
	SafetyNetInterval time.Duration
	// StallAfter: see worker.Config.StallAfter. Defaults to worker.StallAfterDefault.
	StallAfter time.Duration
	// CloseTimeout bounds Run's wait for handlers in flight at shutdown, and ClosePools' wait
	// for the pools after it. Defaults to worker.CloseTimeoutDefault.
	CloseTimeout time.Duration
	// DeadLetterTimeout bounds one dead-letter write: one that does not commit in time (the
	// dead-letter database is partitioned away) nacks the trigger, which comes back. Defaults to
	// worker.DeadLetterTimeoutDefault (10 s).
	DeadLetterTimeout time.Duration
	// DisableReplayOnStart turns off "replay after deploy" (see worker.Config).
	DisableReplayOnStart bool
	// RouterFunc, if set, gets Run's router before it runs: router-level middleware, plugins,
	// Watermill's metrics (package metrics).
	RouterFunc func(*message.Router) error
	// OnBatch, if set, is called after every batch that committed events or failed (see
	// projection.RunnerConfig.OnBatch; package metrics uses it).
	OnBatch func(projection.BatchReport)
	// Metrics, if set, measures everything the client runs: batches, lag, state, condition and
	// horizon (read at scrape time), failed dead letters and, once Run or AddHandlers adds the
	// handlers, their trigger counters, and Watermill's handler metrics on Run's router (on a
	// router of yours, call Metrics.AddRouterMetrics).
	Metrics *metrics.Metrics
	// Relay tunes the relay (TriggersRelay); its Logger defaults to Logger.
	Relay relay.Config
	// WorkerID names this process among those that run the same partitioned projections
	// (projection.Config.Partitions): with New, each such projection's partitions are spread
	// over the processes that Run it, by leases in PostgreSQL (see worker.Leases), and `nudge
	// status --partitions` shows which process owns which. Defaults to the host name, the
	// process id and a random suffix; set it to the pod's name, say.
	WorkerID string
	// TransactionPooling says that the database handle New gets goes through a connection
	// pooler in transaction mode (PgBouncer's pool_mode = transaction), where no session
	// outlives a transaction. New then refuses, with an error matching
	// postgres.ErrSessionNeeded, what needs one: a pool that prepares named statements per
	// connection (pgx's default; add default_query_exec_mode=cache_describe to its URL), and,
	// without SessionConnect, the relay's LISTEN (unless DisableListen) and a partitioned
	// projection's index build. See docs/operations/pgbouncer-and-sizing.md.
	TransactionPooling bool
	// SessionConnect opens a direct connection to PostgreSQL (not through a pooler in
	// transaction mode) for what needs a session of its own: the connection the relay LISTENs
	// on for appends (held while the client runs), and the one a partitioned projection's
	// event index is built on at registration (a session advisory lock, then CREATE INDEX
	// CONCURRENTLY; closed after). postgres.PoolConnect(directPool) or a pgx.Connect to a
	// direct URL. Defaults to connections of New's pool.
	SessionConnect postgres.ConnectFunc
	// DisableListen turns the relay's LISTEN off: it polls, every Relay.MinInterval to
	// Relay.MaxInterval (5 to 25 ms by default).
	DisableListen bool
	// TracerProvider, if set, receives nudge's OpenTelemetry spans: appends, the relay's
	// publishes, triggers, batches, cut-overs, redrives and replays (see docs/guides/tracing.md).
	// Defaults to otel.GetTracerProvider(), a no-op that costs nothing unless the application
	// sets one.
	TracerProvider trace.TracerProvider
}

// WithDefaults returns cfg with every zero field that has a default set to it.
func (cfg Config) WithDefaults() Config {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Triggers == "" {
		cfg.Triggers = TriggersRelay
	}
	if cfg.Relay.Logger == nil {
		cfg.Relay.Logger = cfg.Logger
	}
	return cfg
}

// Validate reports what is wrong with cfg (after WithDefaults), as an error matching
// ErrInvalidConfig.
func (cfg Config) Validate() error {
	switch cfg.Triggers {
	case TriggersRelay:
	case TriggersInTransaction:
		if cfg.Channel == nil {
			return fmt.Errorf("%w: Triggers %q needs a Channel that publishes in a transaction (channel/postgres)", ErrInvalidConfig, cfg.Triggers)
		}
		if _, ok := cfg.Channel.(relay.TxPublisher); !ok {
			return fmt.Errorf("%w: Triggers %q needs a channel that publishes in a transaction (channel/postgres); %T does not: use %q",
				ErrInvalidConfig, cfg.Triggers, cfg.Channel, TriggersRelay)
		}
	default:
		return fmt.Errorf("%w: Triggers %q is not one of %v", ErrInvalidConfig, cfg.Triggers, TriggerModes())
	}
	if len(cfg.Projections) == 0 {
		return fmt.Errorf("%w: Projections is empty: give the client the projections it runs or reports on", ErrInvalidConfig)
	}
	seen := make(map[string]bool, len(cfg.Projections))
	for i, p := range cfg.Projections {
		if p == nil {
			return fmt.Errorf("%w: Projections[%d] is nil", ErrInvalidConfig, i)
		}
		if seen[p.Name()] {
			return fmt.Errorf("%w: projection %q is listed twice", ErrInvalidConfig, p.Name())
		}
		seen[p.Name()] = true
	}
	if err := cfg.Retry.WithDefaults().Validate(); err != nil {
		return fmt.Errorf("%w: Retry: %w", ErrInvalidConfig, err)
	}
	if cfg.CloseTimeout < 0 {
		return fmt.Errorf("%w: CloseTimeout %s is negative", ErrInvalidConfig, cfg.CloseTimeout)
	}
	if cfg.DeadLetterTimeout < 0 {
		return fmt.Errorf("%w: DeadLetterTimeout %s is negative", ErrInvalidConfig, cfg.DeadLetterTimeout)
	}
	return nil
}
