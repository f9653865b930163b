// Package amqp is the RabbitMQ channel, on Watermill's AMQP pub/sub (watermill-amqp v2).
//
// # Topology
//
// With Config.Prefix p (empty by default), the channel declares, all durable:
//
//	exchange  p + "nudge.triggers"              fanout; every trigger is published here
//	queue     p + "nudge.triggers_" + name      one per projection, bound to the exchange
//	exchange  p + "nudge.triggers.partitions"   topic, fed by the fanout exchange (DeclarePartitions)
//	queue     p + "nudge.triggers_" + unit      one per partition unit, bound to the partitions exchange
//
// A partitioned projection's units (DeclarePartitions, which a worker uses) are routed by
// partition: each unit's queue receives only the triggers whose partition keys fall in its
// partition, and those without keys, instead of every trigger (see partition.go for the
// routing keys). A trigger is still published once, to the fanout exchange.
//
// Nothing else: dead letters go to a worker's dead-letter store (worker.Config.DeadLetters),
// never to the broker.
//
// The queues are classic queues, or quorum queues with Config.QueueType QueueQuorum: declared
// with x-queue-type "quorum" and, on RabbitMQ 4 and later, x-delivery-limit -1, so the broker
// never drops a trigger nacked through a long outage (RabbitMQ 4 drops one nacked 20 times by
// default). A projection's queue that exists with another type, or another delivery limit,
// fails Declare with a *QueueMismatchError — except a quorum queue declared on RabbitMQ 3
// without a limit, which is declared as it is, with a warning that the broker's default limit
// applies to it.
//
// Declare creates the queues and bindings of the projections it is given: the broker drops a
// trigger published to the fanout exchange when no queue is bound to it, so declare every
// projection before publishing to it. A trigger addressed to one projection (Trigger.Projection
// set) goes through the default exchange to that projection's queue only.
// Publish never declares that queue: a queue declared by a publisher would be bound to the
// exchange and collect every trigger forever, with nobody consuming it. When this Channel has
// not declared the projection itself, Publish looks the queue up (a passive declare) and fails
// with ErrNotDeclared if no process has declared it — a wrong name or a wrong prefix.
// Declared does that look-up alone. Projection names are checked with name.Validate
// before anything reaches the broker.
//
// Subscriber returns a subscriber of one projection's queue with a prefetch of 1: a
// projection's consumer handles one trigger at a time, and several consumers of one projection
// (in several processes) share its queue. A nack requeues the trigger at once; put Watermill's
// Retry middleware in front of a handler to back off.
//
// # Guarantees
//
// Messages are persistent and publisher confirms are on: when Publish returns nil, the broker
// has taken the trigger into every bound queue, and it survives a broker restart. Publishes
// share a pool of Config.PublishChannels AMQP channels, each waiting for its own confirm, so
// concurrent publishes proceed in parallel up to the pool size and wait beyond it.
//
// # Connections and outages
//
// The channel opens one connection (named Config.ConnectionName, visible in RabbitMQ's
// management UI) shared by its publisher and subscribers. New retries the first dial with
// backoff for up to Config.StartupTimeout (or Config.StartupAttempts), logging each failed
// attempt (the URL's password redacted), then fails with a *ConnectError that says what to
// check. A refused login (user, password or vhost) is not retried. A Config that New refuses
// is a *ConfigError naming the field (matching ErrInvalidConfig).
//
// Once connected, a lost connection is re-established in the background, forever, with
// backoff from 500 ms up to Config.ReconnectMaxInterval; subscriptions resume by themselves.
// While disconnected, Publish fails at once with an error matching ErrDisconnected (nothing is
// buffered): the caller decides, and the projections' start-up catch-up and safety-net tick
// cover a trigger that was never sent. Subscribe, too, fails while disconnected. Declare and
// DeclarePartitions wait instead, up to Config.StartupTimeout, and declare once the
// connection is back: a worker's declarations at its start survive a dropped connection. A delivery
// that was not acked when the connection broke is redelivered by the broker; a subscription
// notices the lost connection only once its consumer acks or nacks the message it holds (that
// ack is lost, hence the redelivery).
//
// # Known limitations of watermill-amqp v2.1.3 (and v3.1.0)
//
//   - The race detector reports a data race on ConnectionWrapper.connected when a connection
//     is lost while a Publish or a subscription's reconnect loop reads it: the connection
//     wrapper replaces that field without synchronisation (connection.go:136,139).
//   - Close while the connection is down leaves one goroutine of the connection wrapper
//     (handleConnectionClose) waiting forever. The channel refuses to dial after Close, so at
//     least no connection is opened behind it.
//   - Its channel pool loses a channel for good when reopening it after a connection loss
//     fails, until every Publish blocks; this package therefore gives each of its publishers a
//     single channel and replaces a publisher whose Publish failed.
package amqp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/internal/backoff"
	"github.com/nudgeworks/nudge/internal/redact"
	"github.com/nudgeworks/nudge/internal/tracing"
	"github.com/nudgeworks/nudge/name"
	"github.com/nudgeworks/nudge/trigger"
)

// Defaults of Config.
const (
	// ConnectionNameDefault is the default Config.ConnectionName.
	ConnectionNameDefault = "nudge"
	// StartupTimeoutDefault is the default Config.StartupTimeout.
	StartupTimeoutDefault = 30 * time.Second
	// PublishChannelsDefault is the default Config.PublishChannels.
	PublishChannelsDefault = 4
	// ReconnectMaxIntervalDefault is the default Config.ReconnectMaxInterval.
	ReconnectMaxIntervalDefault = 10 * time.Second
)

// MaxPrefixLength is the longest Config.Prefix accepted, in bytes: AMQP names hold 255 bytes,
// and the longest name the channel makes is the prefix, "nudge.triggers_" and a projection
// name of name.MaxLength bytes.
const MaxPrefixLength = 255 - len(channel.TriggerTopic+"_") - name.MaxLength

// Timing of the start-up dial and of every dial.
const (
	startupBackoffInitial = 250 * time.Millisecond
	startupBackoffMax     = 5 * time.Second
	dialTimeout           = 10 * time.Second
	minDialTimeout        = 100 * time.Millisecond
)

// ErrDisconnected matches the errors of calls made while the connection to RabbitMQ is lost
// and being re-established. Nothing was sent; try again later.
var ErrDisconnected = errors.New("amqp: not connected to RabbitMQ (reconnecting in the background)")

// ErrClosed matches the errors of calls made after Close.
var ErrClosed = errors.New("amqp: channel is closed")

// ErrNotDeclared matches a trigger addressed to a projection whose queue does not exist on the
// broker: no consumer has declared it (under this Config.Prefix), so nothing would read the
// trigger. Nothing was sent.
var ErrNotDeclared = errors.New("amqp: projection not declared")

// ErrInUse matches an Undeclare of a projection whose queue still has a consumer (a worker of
// the projection runs): the queue is kept. It matches channel.ErrInUse too.
var ErrInUse = fmt.Errorf("amqp: queue in use: %w", channel.ErrInUse)

// ErrInvalidConfig is matched (errors.Is) by every error New and Config.Validate return for a
// Config they cannot use; each is a *ConfigError naming the field.
var ErrInvalidConfig = errors.New("amqp: invalid config")

// ConfigError is a Config that New refuses; it matches ErrInvalidConfig. Problem says what is wrong with the field and what
// to do, without naming the field, so that a program can put the name of its own setting (a
// command-line flag, say) in front of it.
type ConfigError struct {
	// Field is the name of the Config field, e.g. "URL" or "Prefix".
	Field string
	// Problem is what is wrong, e.g. `"a b" may only hold letters, …`. It never holds a
	// password.
	Problem string
}

func (e *ConfigError) Error() string { return "amqp: Config." + e.Field + " " + e.Problem }

// Is makes errors.Is(err, ErrInvalidConfig) true.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }

// ConnectError is New's failure to connect to RabbitMQ.
type ConnectError struct {
	// URL is the broker's URL, its password redacted.
	URL string
	// Attempts is how many times New tried, over Took.
	Attempts int
	Took     time.Duration
	// Refused reports that the broker refused the login (user, password or vhost); New does
	// not retry that.
	Refused bool
	// Reason is the last attempt's error, its password redacted.
	Reason string

	ctxErr        error // the context's error, when it ended the attempts
	outOfAttempts bool  // Config.StartupAttempts ended the attempts
}

func (e *ConnectError) Error() string {
	switch {
	case e.Refused:
		return fmt.Sprintf("amqp: RabbitMQ at %s refused the connection: %s; check the user, password and vhost in Config.URL", e.URL, e.Reason)
	case e.ctxErr != nil:
		return fmt.Sprintf("amqp: RabbitMQ at %s is not reachable (%s, until the context ended: %v): %s", e.URL, e.Tries(), e.ctxErr, e.Reason)
	}
	raise := "Config.StartupTimeout"
	if e.outOfAttempts {
		raise = "Config.StartupAttempts"
	}
	return fmt.Sprintf("amqp: RabbitMQ at %s is not reachable (%s): %s; check that the broker runs and Config.URL points at it, or raise %s",
		e.URL, e.Tries(), e.Reason, raise)
}

// Unwrap returns the context's error when the context ended the attempts.
func (e *ConnectError) Unwrap() error { return e.ctxErr }

// Tries says how often and how long New tried, e.g. "3 attempts in 1.2s" (or "1 attempt" when
// it failed within a millisecond).
func (e *ConnectError) Tries() string {
	tries := fmt.Sprintf("%d attempts", e.Attempts)
	if e.Attempts == 1 {
		tries = "1 attempt"
	}
	if e.Took < time.Millisecond {
		return tries
	}
	return tries + " in " + e.Took.String()
}

// Config configures a Channel.
type Config struct {
	// URL of the broker: amqp://user:password@host:port/vhost (or amqps://). Required. Percent-
	// encode reserved characters in the user and password.
	URL string
	// Prefix starts the name of every exchange and queue the channel declares, e.g. "staging."
	// to share a vhost. Letters, digits, '-', '_', '.' and ':', at most MaxPrefixLength bytes,
	// not starting with "amq.". Defaults to "".
	Prefix string
	// Logger receives the channel's and Watermill's logs. Defaults to discarding them.
	Logger *slog.Logger
	// ConnectionName names the connection in RabbitMQ (its "connection_name" client property).
	// Defaults to ConnectionNameDefault.
	ConnectionName string
	// StartupTimeout is how long New keeps retrying the first connection; it also bounds each
	// attempt, and how long Declare and DeclarePartitions wait for a connection lost while
	// they declare to come back. Defaults to StartupTimeoutDefault.
	StartupTimeout time.Duration
	// StartupAttempts, if positive, is the most attempts New makes at the first connection
	// within StartupTimeout: 1 fails at the first refused connection, as a command-line tool
	// should. Defaults to 0: attempts until StartupTimeout.
	StartupAttempts int
	// PublishChannels is the number of AMQP channels publishes share; each publish waits for
	// its confirm on one of them. Defaults to PublishChannelsDefault.
	PublishChannels int
	// ReconnectMaxInterval caps the wait between attempts to re-establish a lost connection.
	// Defaults to ReconnectMaxIntervalDefault.
	ReconnectMaxInterval time.Duration
	// QueueType is the kind of queue declared for each projection: QueueClassic or QueueQuorum
	// (the production choice for a clustered broker); New refuses any other ("stream"
	// included). An existing queue keeps its kind: Declare fails with a *QueueMismatchError
	// matching ErrQueueTypeMismatch on one of another kind. Defaults to QueueTypeDefault.
	QueueType QueueType
}

// Channel is the RabbitMQ channel. Its methods are safe for concurrent use.
type Channel struct {
	cfg          Config
	log          *slog.Logger
	wlog         watermill.LoggerAdapter
	dialer       *dialer
	conn         *amqp.ConnectionWrapper
	pubConfig    amqp.Config
	slots        chan *amqp.Publisher // PublishChannels entries; nil: to be created
	triggerTopic string
	serverMajor  int // the broker's major version, 0 if unknown

	declared sync.Map // projection name → amqp091.Table: its queue is declared, with these arguments
	// partitions maps the units declared with DeclarePartitions to their partitions.
	partitions sync.Map // unit name → unitPartition
	// keyedTopic is the topic of a trigger with partition keys: the fanout exchange, with the
	// keys' routing keys in the CC header.
	keyedTopic string

	mu     sync.Mutex
	closed bool
	subs   []*amqp.Subscriber
	pubs   map[*amqp.Publisher]struct{} // every publisher not yet discarded
}

var (
	_ channel.Channel    = (*Channel)(nil)
	_ channel.Undeclarer = (*Channel)(nil)
)

var prefixPattern = regexp.MustCompile(`^[A-Za-z0-9_.:-]*$`)

// New connects to RabbitMQ and returns the channel. It retries the first connection for up to
// cfg.StartupTimeout (or until ctx ends), then fails.
func New(ctx context.Context, cfg Config) (*Channel, error) {
	cfg = cfg.WithDefaults()
	uri, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	log = log.With(slog.String("channel", "amqp"))

	c := &Channel{
		cfg:          cfg,
		log:          log,
		wlog:         queueLogger{watermill.NewSlogLogger(log), cfg.Prefix + channel.TriggerTopic + "_"},
		dialer:       &dialer{timeout: dialTimeout},
		triggerTopic: cfg.Prefix + channel.TriggerTopic,
		keyedTopic:   cfg.Prefix + channel.TriggerTopic + "#keyed",
	}
	if uri.ConnectionTimeout > 0 {
		c.dialer.timeout = time.Duration(uri.ConnectionTimeout) * time.Millisecond
	}
	if err := c.connect(ctx); err != nil {
		return nil, err
	}
	if afterConnect != nil {
		afterConnect(cfg.ConnectionName)
	}
	c.pubConfig = c.publisherConfig()
	c.slots = make(chan *amqp.Publisher, cfg.PublishChannels)
	c.pubs = map[*amqp.Publisher]struct{}{}
	lost := false
	for range cfg.PublishChannels {
		var pub *amqp.Publisher
		if !lost {
			if pub, err = c.newPublisher(); err != nil {
				// The connection was lost since it was made (a loaded broker resets
				// connections): the slots stay empty, and each opens its publisher at its
				// first use once the connection is back (acquire), as after a failed publish.
				lost = true
				c.log.Warn("amqp: the connection was lost before the publishing channels opened; each opens at its first publish",
					slog.Any("error", err))
			}
		}
		c.slots <- pub
	}
	return c, nil
}

// afterConnect, when set (by tests), is called by New with the connection's name once its
// connection is made, before the publishing channels open.
var afterConnect func(connectionName string)

// WithDefaults returns cfg with every zero field that has a default set to it.
func (cfg Config) WithDefaults() Config {
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	cfg.ConnectionName = cmp.Or(cfg.ConnectionName, ConnectionNameDefault)
	cfg.StartupTimeout = cmp.Or(cfg.StartupTimeout, StartupTimeoutDefault)
	cfg.PublishChannels = cmp.Or(cfg.PublishChannels, PublishChannelsDefault)
	cfg.ReconnectMaxInterval = cmp.Or(cfg.ReconnectMaxInterval, ReconnectMaxIntervalDefault)
	cfg.QueueType = cmp.Or(cfg.QueueType, QueueTypeDefault)
	return cfg
}

// Validate reports what is wrong with cfg (after WithDefaults) as a *ConfigError naming the
// field, which matches ErrInvalidConfig. It does not connect.
func (cfg Config) Validate() error {
	_, err := cfg.validate()
	return err
}

// validate is Validate, returning the parsed URL.
func (cfg Config) validate() (amqp091.URI, error) {
	if cfg.URL == "" {
		return amqp091.URI{}, &ConfigError{Field: "URL", Problem: "is required, e.g. amqp://guest:guest@localhost:5672/"}
	}
	uri, err := parseURL(cfg.URL)
	if err != nil {
		return amqp091.URI{}, err
	}
	if problem := prefixProblem(cfg.Prefix); problem != "" {
		return amqp091.URI{}, &ConfigError{Field: "Prefix", Problem: problem}
	}
	for _, f := range []struct {
		field    string
		negative bool
		value    any
	}{
		{"StartupTimeout", cfg.StartupTimeout < 0, cfg.StartupTimeout},
		{"StartupAttempts", cfg.StartupAttempts < 0, cfg.StartupAttempts},
		{"PublishChannels", cfg.PublishChannels < 0, cfg.PublishChannels},
		{"ReconnectMaxInterval", cfg.ReconnectMaxInterval < 0, cfg.ReconnectMaxInterval},
	} {
		if f.negative {
			return amqp091.URI{}, &ConfigError{Field: f.field, Problem: fmt.Sprintf("is %v; it must not be negative (0 means the default)", f.value)}
		}
	}
	if cfg.Logger == nil {
		return amqp091.URI{}, &ConfigError{Field: "Logger", Problem: "is nil; call WithDefaults first"}
	}
	if problem := queueTypeProblem(cfg.QueueType); problem != "" {
		return amqp091.URI{}, &ConfigError{Field: "QueueType", Problem: problem}
	}
	return uri, nil
}

// prefixProblem says what is wrong with a Config.Prefix, or "" if nothing is.
func prefixProblem(prefix string) string {
	switch {
	case len(prefix) > MaxPrefixLength:
		return fmt.Sprintf("is %d bytes long; at most %d allowed", len(prefix), MaxPrefixLength)
	case !prefixPattern.MatchString(prefix):
		return fmt.Sprintf("%q may only hold letters, digits, '-', '_', '.' and ':'", prefix)
	case strings.HasPrefix(prefix, "amq."):
		return fmt.Sprintf("%q starts with \"amq.\", which RabbitMQ reserves; choose another", prefix)
	}
	return ""
}

// parseURL checks the broker URL without ever putting its password into an error.
func parseURL(raw string) (amqp091.URI, error) {
	u, err := url.Parse(raw)
	if err != nil {
		var urlErr *url.Error
		if errors.As(err, &urlErr) {
			err = urlErr.Err // without the URL, which holds the password
		}
		return amqp091.URI{}, &ConfigError{Field: "URL", Problem: fmt.Sprintf("is not a valid URL (%v); "+
			"use amqp://user:password@host:port/vhost and percent-encode reserved characters in the user and password", err)}
	}
	uri, err := amqp091.ParseURI(raw)
	if err != nil {
		return amqp091.URI{}, &ConfigError{Field: "URL", Problem: fmt.Sprintf("%s is not an AMQP URL: %s; use amqp://user:password@host:port/vhost",
			redact.URL(raw), redact.Message(err.Error(), raw))}
	}
	if u.Host == "" { // amqp091 would dial localhost instead: amqp:/user:password@host, say
		return amqp091.URI{}, &ConfigError{Field: "URL", Problem: fmt.Sprintf("%s names no host; use amqp://user:password@host:port/vhost", redact.URL(raw))}
	}
	return uri, nil
}

// connectionConfig is the config of the shared connection: named, dialled through c.dialer,
// reconnecting with watermill-amqp's backoff up to ReconnectMaxInterval.
func (c *Channel) connectionConfig() amqp.ConnectionConfig {
	props := amqp091.NewConnectionProperties()
	props.SetClientConnectionName(c.cfg.ConnectionName)
	return amqp.ConnectionConfig{
		AmqpURI:    c.cfg.URL,
		AmqpConfig: &amqp091.Config{Properties: props, Dial: c.dialer.dial},
		Reconnect: &amqp.ReconnectConfig{
			BackoffInitialInterval:     amqp.DefaultReconnectConfig().BackoffInitialInterval,
			BackoffRandomizationFactor: amqp.DefaultReconnectConfig().BackoffRandomizationFactor,
			BackoffMultiplier:          amqp.DefaultReconnectConfig().BackoffMultiplier,
			BackoffMaxInterval:         c.cfg.ReconnectMaxInterval,
		},
	}
}

// connect dials the shared connection, retrying until the start-up deadline.
func (c *Channel) connect(ctx context.Context) error {
	connCfg := c.connectionConfig()
	redacted := redact.URL(c.cfg.URL)
	started := time.Now()
	deadline := started.Add(c.cfg.StartupTimeout)
	ctxDeadline := false // the context's deadline comes first
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline, ctxDeadline = d, true
	}
	c.dialer.setDeadline(deadline)
	defer c.dialer.setDeadline(time.Time{})

	backOff := backoff.Exponential{Initial: startupBackoffInitial, Max: startupBackoffMax}
	for attempt := 1; ; attempt++ {
		conn, err := amqp.NewConnection(connCfg, c.wlog)
		if err == nil {
			c.conn = conn
			c.serverMajor = serverMajor(conn.Connection().Properties)
			c.log.Info("amqp: connected to RabbitMQ", slog.String("url", redacted),
				slog.Int("attempts", attempt), slog.Duration("took", time.Since(started).Round(time.Millisecond)))
			return nil
		}
		msg := redact.Message(err.Error(), c.cfg.URL)
		cerr := &ConnectError{URL: redacted, Attempts: attempt, Took: time.Since(started).Round(time.Millisecond), Reason: msg}
		var amqpErr *amqp091.Error
		remaining := time.Until(deadline)
		switch {
		case errors.As(err, &amqpErr) && (amqpErr.Code == amqp091.AccessRefused || amqpErr.Code == amqp091.NotAllowed):
			cerr.Refused = true
			return cerr
		case ctx.Err() != nil:
			cerr.ctxErr = ctx.Err()
			return cerr
		case c.cfg.StartupAttempts > 0 && attempt >= c.cfg.StartupAttempts:
			cerr.outOfAttempts = true
			return cerr
		case remaining <= 0:
			if ctxDeadline {
				cerr.ctxErr = context.DeadlineExceeded // a moment before ctx.Err says so
			}
			return cerr
		}
		wait := min(backOff.Next(), remaining)
		c.log.Warn("amqp: RabbitMQ not reachable, retrying", slog.String("url", redacted),
			slog.Int("attempt", attempt), slog.Duration("retry_in", wait),
			slog.Duration("gives_up_in", remaining.Round(time.Millisecond)), slog.String("error", msg))
		_ = backoff.Sleep(ctx, wait) // an ended ctx is seen by the next attempt's checks
	}
}

// publisherConfig is the config of every publisher. The trigger topic is the fanout exchange;
// every other topic names a queue, reached through the default exchange.
func (c *Channel) publisherConfig() amqp.Config {
	cfg := amqp.NewDurableQueueConfig("")
	cfg.Exchange = amqp.ExchangeConfig{
		GenerateName: func(topic string) string {
			if topic == c.triggerTopic || topic == c.keyedTopic {
				return c.triggerTopic
			}
			return ""
		},
		Type:    "fanout",
		Durable: true,
	}
	cfg.Publish.GenerateRoutingKey = func(topic string) string {
		switch topic {
		case c.triggerTopic:
			return ""
		case c.keyedTopic:
			return keyedRoutingKey
		}
		return topic
	}
	cfg.Publish.ConfirmDelivery = true
	cfg.Marshaler = marshaler{}
	// One channel per publisher, and a pool of publishers (c.slots) instead of one publisher
	// with a pool of channels: watermill-amqp v2.1.3 loses a pooled channel for good when it
	// fails to reopen it after a connection loss (pooledChannelProvider.Channel does not put
	// it back), and once all are lost every Publish blocks forever. A publisher whose Publish
	// failed is discarded and replaced instead.
	cfg.Publish.ChannelPoolSize = 1
	return cfg
}

// newPublisher returns a new publisher on the shared connection, with its channel open.
func (c *Channel) newPublisher() (*amqp.Publisher, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	pub, err := amqp.NewPublisherWithConnection(c.pubConfig, c.wlog, c.conn)
	if err != nil {
		return nil, fmt.Errorf("amqp: open a publishing channel: %w", err)
	}
	c.pubs[pub] = struct{}{}
	return pub, nil
}

// acquire takes a publisher from the pool, creating it if its slot is empty.
func (c *Channel) acquire(ctx context.Context) (*amqp.Publisher, error) {
	var pub *amqp.Publisher
	select {
	case pub = <-c.slots:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if pub != nil {
		return pub, nil
	}
	pub, err := c.newPublisher()
	if err != nil {
		c.slots <- nil
		return nil, err
	}
	return pub, nil
}

// release puts pub back into the pool, or, after a failed publish, closes it and leaves its
// slot empty.
func (c *Channel) release(pub *amqp.Publisher, failed bool) {
	if !failed {
		c.slots <- pub
		return
	}
	c.mu.Lock()
	delete(c.pubs, pub)
	c.mu.Unlock()
	closePublisher(pub)
	c.slots <- nil
}

// closePublisher closes pub. watermill-amqp v2.1.3 panics (nil *amqp091.Channel) closing a
// publisher whose channel failed to reopen after a connection loss; that channel died with
// its connection, so there is nothing left to close.
func closePublisher(pub *amqp.Publisher) {
	defer func() { _ = recover() }()
	_ = pub.Close()
}

// projectionConfig is the subscriber config of one projection's queue: with the arguments
// Declare declared it with, else those of Config.QueueType.
func (c *Channel) projectionConfig(name string) amqp.Config {
	args := queueArguments(c.cfg.QueueType, c.serverMajor)
	if declared, ok := c.declared.Load(name); ok {
		args = declared.(amqp091.Table)
	}
	return c.projectionConfigWith(name, args)
}

// QueueName returns the name of the projection's queue: Config.Prefix + "nudge.triggers_" +
// the projection's name.
func (c *Channel) QueueName(name string) string {
	return c.projectionConfig(name).Queue.GenerateName(c.triggerTopic)
}

// newSubscriber returns a subscriber on the shared connection, closed by Close, that logs
// through log.
func (c *Channel) newSubscriber(cfg amqp.Config, log watermill.LoggerAdapter) (*amqp.Subscriber, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	sub, err := amqp.NewSubscriberWithConnection(cfg, log, c.conn)
	if err != nil {
		return nil, fmt.Errorf("amqp: create subscriber: %w", err)
	}
	c.subs = append(c.subs, sub)
	return sub, nil
}

// Declare implements channel.Channel: it declares the exchange and each projection's queue
// bound to it. It declares every queue on one AMQP channel without waiting for each answer,
// and only when the broker refuses one does it declare them again one by one, to tell which
// and why.
func (c *Channel) Declare(ctx context.Context, projections ...string) error {
	for _, projection := range projections {
		if err := name.Validate(projection); err != nil {
			return err
		}
	}
	return c.declareAll(ctx, projections)
}

// declareAll declares the queues of names (projections, or units declared with
// DeclarePartitions): all at once, else, after a refusal, one by one. While the connection is
// down it declares again, with New's backoff, once it is back: up to Config.StartupTimeout
// from the first loss, or until ctx ends (an error matching ErrDisconnected then). A worker's
// declarations at its start so survive a broker that drops the connection meanwhile, as New
// survives one that is not up yet.
func (c *Channel) declareAll(ctx context.Context, names []string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(names) == 0 {
		return nil
	}
	var (
		giveUp time.Time
		wait   = startupBackoffInitial
	)
	for {
		err := c.declareNames(ctx, names)
		if !errors.Is(err, ErrDisconnected) {
			return err
		}
		if giveUp.IsZero() {
			giveUp = time.Now().Add(c.cfg.StartupTimeout)
		}
		left := time.Until(giveUp)
		if left <= 0 {
			return err
		}
		c.log.Warn("amqp: the connection was lost while declaring; declaring again once it is back",
			slog.Int("queues", len(names)), slog.Duration("retry_in", min(wait, left)), slog.Duration("gives_up_in", left), slog.Any("error", err))
		t := time.NewTimer(min(wait, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, startupBackoffMax)
	}
}

// declareNames is one attempt of declareAll.
func (c *Channel) declareNames(ctx context.Context, names []string) error {
	args := queueArguments(c.cfg.QueueType, c.serverMajor)
	err := c.declareBatch(names, args)
	if err == nil {
		for _, n := range names {
			c.declared.Store(n, args)
		}
		return nil
	}
	c.log.Debug("amqp: declaring the queues at once failed; declaring them one by one", slog.Any("error", err))
	for _, projection := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := c.declareProjection(projection); err != nil {
			return err
		}
	}
	return nil
}

// declareBatch declares the queues of names with args, and their bindings, on one AMQP channel,
// sending every declaration without waiting for its answer; one that waits at the end tells
// whether the broker took them all (it closes the channel at the first it refuses).
func (c *Channel) declareBatch(names []string, args amqp091.Table) error {
	if err := c.usable(); err != nil {
		return err
	}
	ch, err := c.conn.Connection().Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }() // already closed by the broker after a refusal
	partitions := false
	for _, n := range names {
		if _, ok := c.unitOf(n); ok {
			partitions = true
			break
		}
	}
	if err := c.declareExchanges(ch, partitions); err != nil {
		return err
	}
	for _, n := range names {
		queue := c.QueueName(n)
		if _, err := ch.QueueDeclare(queue, true, false, false, true, args); err != nil {
			return err
		}
		for _, b := range c.bindings(n) {
			if err := ch.QueueBind(queue, b.key, b.exchange, true, nil); err != nil {
				return err
			}
		}
	}
	_, err = ch.QueueDeclarePassive(c.QueueName(names[len(names)-1]), true, false, false, false, nil)
	return err
}

func (c *Channel) declareProjection(name string) error {
	args, err := c.declareQueue(name)
	if err != nil {
		return err
	}
	c.declared.Store(name, args)
	return nil
}

// declareLog is the logger of the declarations of a projection's queue.
func (c *Channel) declareLog(name string) watermill.LoggerAdapter {
	return c.wlog.With(watermill.LogFields{"projection": name})
}

// initialize declares what a subscriber of topic with cfg consumes, logging through log.
func (c *Channel) initialize(cfg amqp.Config, topic, queue string, log watermill.LoggerAdapter) error {
	if err := c.usable(); err != nil {
		return fmt.Errorf("amqp: declare queue %s: %w", queue, err)
	}
	sub, err := amqp.NewSubscriberWithConnection(cfg, log, c.conn)
	if err != nil {
		return fmt.Errorf("amqp: create subscriber: %w", err)
	}
	defer func() { _ = sub.Close() }()
	if err := sub.SubscribeInitialize(topic); err != nil {
		if mismatch := queueMismatch(queue, cfg.Queue.Arguments, err); mismatch != nil {
			return mismatch
		}
		return c.brokerError("declare queue "+queue, err)
	}
	return nil
}

// usable returns ErrClosed after Close and ErrDisconnected while the connection is down.
//
// It asks the connection under c.mu: watermill-amqp v2.1.3 replaces the connection's
// "connected" channel, unsynchronised, in a goroutine of its own once the connection closes,
// so a read that Close's critical section does not order before that write is a data race.
// Holding c.mu orders every read before Close (which sets closed under c.mu before it closes
// the connection) or has it see closed and not read at all. A reconnect after a connection
// loss still writes unordered (see the Makefile's outage tests).
func (c *Channel) usable() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return ErrClosed
	case !c.conn.IsConnected():
		return ErrDisconnected
	}
	return nil
}

// brokerError wraps err of what; it matches ErrDisconnected when the connection is down.
func (c *Channel) brokerError(what string, err error) error {
	if uerr := c.usable(); uerr != nil {
		return fmt.Errorf("amqp: %s: %w (%w)", what, uerr, err)
	}
	return fmt.Errorf("amqp: %s: %w", what, err)
}

// Publish implements channel.Channel. It returns once the broker confirmed the trigger, or
// when ctx ends (the trigger may then still arrive).
func (c *Channel) Publish(ctx context.Context, t trigger.Trigger) error {
	topic := c.triggerTopic
	if t.Projection != "" {
		if err := name.Validate(t.Projection); err != nil {
			return err
		}
		topic = c.QueueName(t.Projection)
	}
	msg, err := trigger.NewMessage(t)
	if err != nil {
		return err
	}
	msg.SetContext(ctx)
	tracing.Inject(ctx, msg.Metadata) // the consumer's span is a child of ctx's
	if t.Projection == "" && len(t.Keys) > 0 {
		topic = c.keyedTopic
		msg.Metadata.Set(metadataRouting, joinRouting(routingKeys(t.Keys)))
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if t.Projection != "" {
		if _, ok := c.declared.Load(t.Projection); !ok {
			ok, err := c.Declared(ctx, t.Projection)
			if err != nil {
				return err
			}
			if !ok {
				return c.notDeclared(t.Projection)
			}
		}
	}
	return c.publish(ctx, topic, msg)
}

// Undeclare deletes the projections' queues, with the triggers queued there: use it for a
// projection that no worker runs any more (a version replaced by a newer one, a projection
// deleted). A durable queue that no one consumes keeps every trigger published after its
// consumer left, and RabbitMQ confirms a persistent message to such a queue only once it is
// on disk: each publish waits for the disk, and the queue grows for ever. A queue that
// still has a consumer is left as it is, and Undeclare fails with an error matching
// ErrInUse once it has tried the others; a queue that does not exist is no error.
// A process that declares the projection again (a worker of it starting) creates the queue
// anew.
func (c *Channel) Undeclare(ctx context.Context, projections ...string) error {
	for _, projection := range projections {
		if err := name.Validate(projection); err != nil {
			return err
		}
	}
	var errs []error
	for _, projection := range projections {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := c.deleteQueue(c.QueueName(projection)); err != nil {
			errs = append(errs, err)
			continue
		}
		c.declared.Delete(projection)
	}
	return errors.Join(errs...)
}

// deleteQueue deletes queue, if it has no consumer, on a channel of its own: the broker closes
// the channel when the queue is in use.
func (c *Channel) deleteQueue(queue string) error {
	what := "delete queue " + queue
	if err := c.usable(); err != nil {
		return fmt.Errorf("amqp: %s: %w", what, err)
	}
	ch, err := c.conn.Connection().Channel()
	if err != nil {
		return c.brokerError(what, err)
	}
	defer func() { _ = ch.Close() }() // already closed by the broker when the queue is in use
	_, err = ch.QueueDelete(queue, true, false, false)
	var amqpErr *amqp091.Error
	switch {
	case errors.As(err, &amqpErr) && amqpErr.Code == amqp091.PreconditionFailed:
		return fmt.Errorf("amqp: %s: %w: a process still consumes it (%s); stop the projection's workers, then undeclare it again",
			what, ErrInUse, amqpErr.Reason)
	case err != nil:
		return c.brokerError(what, err)
	}
	c.log.Debug("amqp: queue deleted (or there was none)", slog.String("queue", queue))
	return nil
}

// Declared reports whether the projection's queue exists on the broker, declared by this
// Channel or by any other process with the same Config.Prefix (a worker of the projection).
// It looks the queue up without creating it (a passive declare).
func (c *Channel) Declared(ctx context.Context, projection string) (bool, error) {
	if err := name.Validate(projection); err != nil {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	return c.queueExists(c.QueueName(projection))
}

// queueExists looks queue up with a passive declare on a channel of its own: the broker
// closes the channel when the queue does not exist.
func (c *Channel) queueExists(queue string) (bool, error) {
	what := "look up queue " + queue
	if err := c.usable(); err != nil {
		return false, fmt.Errorf("amqp: %s: %w", what, err)
	}
	ch, err := c.conn.Connection().Channel()
	if err != nil {
		return false, c.brokerError(what, err)
	}
	defer func() { _ = ch.Close() }() // already closed by the broker when the queue is missing
	_, err = ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	var amqpErr *amqp091.Error
	switch {
	case errors.As(err, &amqpErr) && amqpErr.Code == amqp091.NotFound:
		return false, nil
	case err != nil:
		return false, c.brokerError(what, err)
	}
	return true, nil
}

// notDeclared is the error of a trigger addressed to a projection whose queue does not exist.
func (c *Channel) notDeclared(name string) error {
	return fmt.Errorf("%w: no queue %s on RabbitMQ (prefix %q): no consumer of projection %s has declared it, "+
		"so nothing would read the trigger; check the projection's name and Config.Prefix (it must be the consumers'), "+
		"or call Declare(ctx, %q) first", ErrNotDeclared, c.QueueName(name), c.cfg.Prefix, name, name)
}

// publish publishes msg to topic and waits for the broker's confirm, or until ctx ends.
func (c *Channel) publish(ctx context.Context, topic string, msg *message.Message) error {
	if err := c.usable(); err != nil {
		return fmt.Errorf("amqp: publish to %s: %w", topic, err)
	}
	pub, err := c.acquire(ctx)
	if err != nil {
		return c.brokerError("publish to "+topic, err)
	}
	send := func() error {
		err := pub.Publish(topic, msg)
		c.release(pub, err != nil)
		if err != nil {
			return c.brokerError("publish to "+topic, err)
		}
		return nil
	}
	if ctx.Done() == nil {
		return send()
	}
	// Watermill's Publish does not give up waiting for a confirm when the context ends.
	done := make(chan error, 1)
	go func() { done <- send() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("amqp: publish to %s: no confirm yet (the message may still arrive): %w", topic, ctx.Err())
	}
}

// publisher is the message.Publisher of Channel.Publisher.
type publisher struct{ c *Channel }

// Publish publishes each message with its own context.
func (p publisher) Publish(topic string, msgs ...*message.Message) error {
	for _, msg := range msgs {
		if err := p.c.publish(msg.Context(), topic, msg); err != nil {
			return err
		}
	}
	return nil
}

// Close does nothing: Channel.Close closes the publishers.
func (p publisher) Close() error { return nil }

// Subscriber implements channel.Channel: a new subscriber of the projection's queue, and the
// trigger topic to subscribe to. Subscribe declares the queue and its binding, again after
// every reconnect. The subscriber is closed by its user or by Close.
func (c *Channel) Subscriber(projection string) (message.Subscriber, string, error) {
	if err := name.Validate(projection); err != nil {
		return nil, "", err
	}
	sub, err := c.newSubscriber(c.projectionConfig(projection), watermill.NewSlogLogger(c.log.With(slog.String("projection", projection))))
	if err != nil {
		return nil, "", err
	}
	return sub, c.triggerTopic, nil
}

// Publisher implements channel.Channel. It publishes through the same pool of confirmed
// channels as Publish, each message with its own context: to the fanout exchange for the
// trigger topic, and for any other topic (a projection's queue, QueueName) through the default
// exchange to the queue of that name, which must exist. Its Close does nothing; Close closes it.
func (c *Channel) Publisher() message.Publisher { return publisher{c} }

// Durable implements channel.Channel: queues and messages are durable.
func (c *Channel) Durable() bool { return true }

// Close implements channel.Channel: it closes the publisher, every subscriber (their
// subscriptions end and unacked deliveries go back to their queues) and the connection. It is
// safe to call more than once.
func (c *Channel) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	subs, pubs := c.subs, c.pubs
	c.subs, c.pubs = nil, nil
	c.mu.Unlock()

	// No dial after Close: a reconnect in progress gives up instead of opening a connection
	// nobody closes.
	c.dialer.closed.Store(true)
	var errs []error
	// Publishers first: a publish waiting for its confirm holds the connection's wait group,
	// which the connection's Close waits for; closing its channel ends the wait.
	for pub := range pubs {
		closePublisher(pub)
	}
	for _, sub := range subs {
		if err := sub.Close(); err != nil {
			errs = append(errs, fmt.Errorf("amqp: close subscriber: %w", err))
		}
	}
	if err := c.conn.Close(); err != nil {
		errs = append(errs, fmt.Errorf("amqp: close connection: %w", err))
	}
	return errors.Join(errs...)
}

// dialer opens the TCP connections: within the start-up deadline while New runs, never after
// Close.
type dialer struct {
	timeout  time.Duration
	deadline atomic.Int64 // UnixNano; 0 when New has returned
	closed   atomic.Bool
}

func (d *dialer) setDeadline(t time.Time) {
	if t.IsZero() {
		d.deadline.Store(0)
		return
	}
	d.deadline.Store(t.UnixNano())
}

func (d *dialer) dial(network, addr string) (net.Conn, error) {
	if d.closed.Load() {
		return nil, ErrClosed
	}
	timeout := d.timeout
	if dl := d.deadline.Load(); dl != 0 {
		timeout = max(min(timeout, time.Until(time.Unix(0, dl))), minDialTimeout)
	}
	return amqp091.DefaultDial(timeout)(network, addr)
}
