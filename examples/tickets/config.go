package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/nudgeworks/nudge/retry"
)

// Mode says which parts of the service a process runs.
type Mode string

const (
	// ModeAll runs the HTTP API and the projections' worker in one process.
	ModeAll Mode = "all"
	// ModeAPI runs the HTTP API only: it appends events and serves the read models and
	// statuses; the workers publish the triggers and run the projections.
	ModeAPI Mode = "api"
	// ModeWorker runs the projections, from their triggers, and the relay that publishes the
	// triggers; no HTTP.
	ModeWorker Mode = "worker"
)

// Modes lists every mode.
func Modes() []Mode { return []Mode{ModeAll, ModeAPI, ModeWorker} }

// ServesHTTP reports whether a process in mode m runs the HTTP API.
func (m Mode) ServesHTTP() bool { return m == ModeAll || m == ModeAPI }

// RunsWorker reports whether a process in mode m runs the projections.
func (m Mode) RunsWorker() bool { return m == ModeAll || m == ModeWorker }

// ChannelKind names the broker that carries the triggers.
type ChannelKind string

const (
	// ChannelAMQP carries triggers through RabbitMQ.
	ChannelAMQP ChannelKind = "amqp"
	// ChannelPostgres carries triggers through queue tables in the event store's database.
	ChannelPostgres ChannelKind = "postgres"
)

// ChannelKinds lists every channel.
func ChannelKinds() []ChannelKind { return []ChannelKind{ChannelAMQP, ChannelPostgres} }

// Defaults of the flags.
const (
	// DatabaseURLDefault is the PostgreSQL of `make up` and docker-compose.yml.
	DatabaseURLDefault = "postgres://postgres@127.0.0.1:5432/postgres"
	// AMQPURLDefault is the RabbitMQ of `make up` and docker-compose.yml.
	AMQPURLDefault = "amqp://guest:guest@127.0.0.1:5672/"
	// AddrDefault is where the HTTP API listens.
	AddrDefault = ":8080"
	// TitleWidthDefault is the width of ticket_list's title column: narrower than the
	// MaxTitleLength the API accepts, on purpose (see README.md, "A poison event").
	TitleWidthDefault = 100
	// ListVersionDefault is the version of ticket_list a process runs: 1, the first shape.
	ListVersionDefault = 1
	// SafetyNetDefault is how often the worker catches every projection up without a trigger.
	SafetyNetDefault = 30 * time.Second
	// ShutdownTimeoutDefault bounds the wait for HTTP requests in flight at shutdown.
	ShutdownTimeoutDefault = 10 * time.Second
)

// maxTitleWidth is the widest varchar PostgreSQL allows.
const maxTitleWidth = 10_485_760

// listVersions are the versions of ticket_list this code has (see README.md, "Change the read
// model's shape").
var listVersions = []int{1, 2}

// Config is the service's configuration. Flags (with environment fallbacks) fill it in main;
// the tests fill it directly.
type Config struct {
	// DatabaseURL is the PostgreSQL URL (--db, $NUDGE_DATABASE_URL). The pool holds at most
	// 10 connections unless the URL sets pool_max_conns.
	DatabaseURL string
	// AMQPURL is the RabbitMQ URL (--amqp, $NUDGE_AMQP_URL); used with ChannelAMQP only.
	AMQPURL string
	// AMQPPrefix starts the name of every exchange and queue (--amqp-prefix, $NUDGE_AMQP_PREFIX).
	AMQPPrefix string
	// Channel carries the triggers (--channel, $NUDGE_CHANNEL). Defaults to ChannelAMQP.
	Channel ChannelKind
	// Mode says what this process runs (--mode, $TICKETS_MODE). Defaults to ModeAll.
	Mode Mode
	// Addr is the HTTP listen address (--addr, $TICKETS_ADDR); main listens on it.
	Addr string
	// Schema holds nudge's tables and the read models (--schema, $NUDGE_SCHEMA). Defaults to
	// the connection's search_path.
	Schema string
	// TitleWidth is the width of ticket_list's title column (--title-width,
	// $TICKETS_TITLE_WIDTH). ticket_list's init hook widens the column to it at start (it never
	// narrows it). Defaults to TitleWidthDefault.
	TitleWidth int
	// ListVersion is the version of ticket_list this process runs (--ticket-list-version,
	// $TICKETS_LIST_VERSION): 1, or 2, which adds the column resolution_seconds. Deploying 2
	// beside 1 builds it beside the live version and cuts over by itself. Defaults to
	// ListVersionDefault.
	ListVersion int
	// DisableReplayOnStart stops the worker from replaying its projections' dead letters when it
	// starts (--replay-on-start=false, $TICKETS_REPLAY_ON_START=false). By default it replays
	// them: deploying a fix is enough.
	DisableReplayOnStart bool
	// SafetyNet is how often the worker catches every projection up without a trigger
	// (--safety-net, $TICKETS_SAFETY_NET); negative turns the tick off. Defaults to
	// SafetyNetDefault.
	SafetyNet time.Duration
	// PollInterval is how often an idle PostgreSQL-channel subscription polls (--poll-interval,
	// $TICKETS_POLL_INTERVAL). 0 means the channel's default (100 ms).
	PollInterval time.Duration
	// LogLevel is the lowest level logged (--log-level, $TICKETS_LOG_LEVEL).
	LogLevel slog.Level
	// TraceStdout exports OpenTelemetry traces to stdout (--trace-stdout,
	// $TICKETS_TRACE_STDOUT): main sets TracerProvider to one that writes every span as JSON.
	TraceStdout bool
	// TracerProvider receives the service's spans (nudge.Config.TracerProvider). Defaults to
	// otel.GetTracerProvider(), a no-op. Not a flag: main sets it for TraceStdout.
	TracerProvider trace.TracerProvider
	// Retry is the worker's backoff before a failing trigger is dead-lettered; zero fields take
	// package retry's defaults (5 attempts over about 3 s). Not a flag: the tests shorten it.
	Retry retry.Policy
	// ShutdownTimeout bounds the wait for HTTP requests in flight at shutdown. Defaults to
	// ShutdownTimeoutDefault. Not a flag.
	ShutdownTimeout time.Duration
	// Logger receives the service's JSON logs. Defaults to slog.Default(). Not a flag.
	Logger *slog.Logger

	// listV2Hook, when set, runs first in every handler of ticket_list version 2, with
	// whether the event is history (projection.Replaying): the tests hold the build with it.
	listV2Hook func(ctx context.Context, replaying bool) error
}

// ErrInvalidConfig matches every configuration the service refuses.
var ErrInvalidConfig = errors.New("tickets: invalid configuration")

// flagEnv maps each flag to the environment variable it falls back to.
var flagEnv = []struct{ flag, env string }{
	{"db", "NUDGE_DATABASE_URL"},
	{"amqp", "NUDGE_AMQP_URL"},
	{"amqp-prefix", "NUDGE_AMQP_PREFIX"},
	{"channel", "NUDGE_CHANNEL"},
	{"mode", "TICKETS_MODE"},
	{"addr", "TICKETS_ADDR"},
	{"schema", "NUDGE_SCHEMA"},
	{"title-width", "TICKETS_TITLE_WIDTH"},
	{"ticket-list-version", "TICKETS_LIST_VERSION"},
	{"replay-on-start", "TICKETS_REPLAY_ON_START"},
	{"safety-net", "TICKETS_SAFETY_NET"},
	{"poll-interval", "TICKETS_POLL_INTERVAL"},
	{"log-level", "TICKETS_LOG_LEVEL"},
	{"trace-stdout", "TICKETS_TRACE_STDOUT"},
}

// parseConfig reads the flags in args; a flag not given takes its environment variable (from
// getenv), else its default. Usage goes to output. The defaults shown never come from the
// environment, so a password in $NUDGE_DATABASE_URL is never printed.
func parseConfig(args []string, getenv func(string) string, output io.Writer) (Config, error) {
	cfg := Config{}
	var (
		channelName, modeName string
		replayOnStart         bool
	)
	fs := flag.NewFlagSet("tickets", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.StringVar(&cfg.DatabaseURL, "db", DatabaseURLDefault, "PostgreSQL `URL` ($NUDGE_DATABASE_URL)")
	fs.StringVar(&cfg.AMQPURL, "amqp", AMQPURLDefault, "RabbitMQ `URL`, for --channel amqp ($NUDGE_AMQP_URL)")
	fs.StringVar(&cfg.AMQPPrefix, "amqp-prefix", "", "`prefix` of the exchanges and queues ($NUDGE_AMQP_PREFIX)")
	fs.StringVar(&channelName, "channel", string(ChannelAMQP), "trigger channel: amqp or postgres ($NUDGE_CHANNEL)")
	fs.StringVar(&modeName, "mode", string(ModeAll), "what to run: all, api (HTTP only) or worker (projections and relay) ($TICKETS_MODE)")
	fs.StringVar(&cfg.Addr, "addr", AddrDefault, "HTTP listen `address` ($TICKETS_ADDR)")
	fs.StringVar(&cfg.Schema, "schema", "", "`schema` of nudge's tables and the read models; default: the search_path ($NUDGE_SCHEMA)")
	fs.IntVar(&cfg.TitleWidth, "title-width", TitleWidthDefault, "width of ticket_list's title column; start with a wider one to widen it ($TICKETS_TITLE_WIDTH)")
	fs.IntVar(&cfg.ListVersion, "ticket-list-version", ListVersionDefault, "version of ticket_list to run: 1, or 2 (adds resolution_seconds; built beside 1, then cut over) ($TICKETS_LIST_VERSION)")
	fs.BoolVar(&replayOnStart, "replay-on-start", true, "replay the projections' dead letters when the worker starts ($TICKETS_REPLAY_ON_START)")
	fs.DurationVar(&cfg.SafetyNet, "safety-net", SafetyNetDefault, "catch every projection up this often without a trigger; negative: never ($TICKETS_SAFETY_NET)")
	fs.DurationVar(&cfg.PollInterval, "poll-interval", 0, "PostgreSQL channel: idle poll interval; 0: the channel's 100ms ($TICKETS_POLL_INTERVAL)")
	fs.TextVar(&cfg.LogLevel, "log-level", slog.LevelInfo, "lowest log `level`: debug, info, warn or error ($TICKETS_LOG_LEVEL)")
	fs.BoolVar(&cfg.TraceStdout, "trace-stdout", false, "export OpenTelemetry traces to stdout ($TICKETS_TRACE_STDOUT)")
	if err := fs.Parse(args); err != nil {
		return Config{}, err // flag.ErrHelp for -h; the flag package has printed the problem
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("%w: unexpected arguments %q; every setting is a flag (see -h)", ErrInvalidConfig, fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, fe := range flagEnv {
		v := getenv(fe.env)
		if set[fe.flag] || v == "" {
			continue
		}
		if err := fs.Set(fe.flag, v); err != nil {
			return Config{}, fmt.Errorf("%w: $%s: %w", ErrInvalidConfig, fe.env, err)
		}
	}
	cfg.Channel, cfg.Mode, cfg.DisableReplayOnStart = ChannelKind(channelName), Mode(modeName), !replayOnStart
	if cfg.Mode.ServesHTTP() && cfg.Addr == "" {
		return Config{}, fmt.Errorf("%w: no HTTP address for mode %s: pass --addr, e.g. :8080", ErrInvalidConfig, cfg.Mode)
	}
	return cfg, cfg.validate()
}

// withDefaults returns cfg with its zero fields set to their defaults.
func (cfg Config) withDefaults() Config {
	if cfg.Channel == "" {
		cfg.Channel = ChannelAMQP
	}
	if cfg.Mode == "" {
		cfg.Mode = ModeAll
	}
	if cfg.TitleWidth == 0 {
		cfg.TitleWidth = TitleWidthDefault
	}
	if cfg.ListVersion == 0 {
		cfg.ListVersion = ListVersionDefault
	}
	if cfg.SafetyNet == 0 {
		cfg.SafetyNet = SafetyNetDefault
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = ShutdownTimeoutDefault
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// validate checks a configuration after defaults; every error matches ErrInvalidConfig and
// says what to use instead.
func (cfg Config) validate() error {
	cfg = cfg.withDefaults()
	var problems []string
	if !slices.Contains(Modes(), cfg.Mode) {
		problems = append(problems, fmt.Sprintf("mode %q: use one of %v", cfg.Mode, Modes()))
	}
	if !slices.Contains(ChannelKinds(), cfg.Channel) {
		problems = append(problems, fmt.Sprintf("channel %q: use one of %v", cfg.Channel, ChannelKinds()))
	}
	if cfg.DatabaseURL == "" {
		problems = append(problems, "no database URL: pass --db postgres://user:password@host:5432/dbname or set NUDGE_DATABASE_URL")
	}
	if cfg.Channel == ChannelAMQP && cfg.AMQPURL == "" {
		problems = append(problems, "no RabbitMQ URL for --channel amqp: pass --amqp amqp://user:password@host:5672/ or set NUDGE_AMQP_URL")
	}
	if cfg.TitleWidth < 1 || cfg.TitleWidth > maxTitleWidth {
		problems = append(problems, fmt.Sprintf("title width %d: use 1 to %d", cfg.TitleWidth, maxTitleWidth))
	}
	if !slices.Contains(listVersions, cfg.ListVersion) {
		problems = append(problems, fmt.Sprintf("ticket_list version %d: use one of %v", cfg.ListVersion, listVersions))
	}
	if cfg.PollInterval < 0 {
		problems = append(problems, fmt.Sprintf("poll interval %s is negative", cfg.PollInterval))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, strings.Join(problems, "; "))
	}
	return nil
}
