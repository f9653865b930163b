package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/channel/amqp"
	chpg "github.com/nudgeworks/nudge/channel/postgres"
	"github.com/nudgeworks/nudge/internal/redact"
	"github.com/nudgeworks/nudge/relay"
	"github.com/nudgeworks/nudge/trigger"
)

// connectTimeout bounds each connection the CLI opens, to PostgreSQL and to RabbitMQ alike:
// both fail after one attempt, so an unreachable broker fails as fast as an unreachable
// database.
const connectTimeout = 5 * time.Second

// connect opens a small pool on --db and checks that the server answers. Errors name the host
// and database but never the password.
func (c *cli) connect(ctx context.Context) (*pgxpool.Pool, error) {
	raw := c.g.db
	if raw == "" {
		return nil, usageErrorf("no database given: set %s or pass --db postgres://user:password@host:5432/dbname", envDatabaseURL)
	}
	cfg, err := pgxpool.ParseConfig(raw)
	if err != nil {
		return nil, usageErrorf("--db is not a valid PostgreSQL URL (%s); use postgres://user:password@host:5432/dbname",
			redact.Message(unwrapURLError(err).Error(), raw))
	}
	cfg.MaxConns = 4
	if !strings.Contains(raw, "default_query_exec_mode") {
		// No statement prepared by name: the CLI works through PgBouncer in transaction
		// mode too, and its few queries lose nothing.
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	where := fmt.Sprintf("%s (database %q, user %q)",
		net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))), cfg.ConnConfig.Database, cfg.ConnConfig.User)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("cannot reach PostgreSQL at %s: %s; check --db or %s", where, redact.Message(err.Error(), raw), envDatabaseURL)
	}
	pingCtx, cancel := context.WithTimeout(ctx, connectTimeout+time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("connect to PostgreSQL at %s: %w", where, ctx.Err())
		}
		return nil, fmt.Errorf("cannot reach PostgreSQL at %s: %s; check that the server runs and that --db or %s is right",
			where, redact.Message(err.Error(), raw), envDatabaseURL)
	}
	return pool, nil
}

// unwrapURLError drops a *url.Error's URL, which may hold the password.
func unwrapURLError(err error) error {
	var uerr *url.Error
	if errors.As(err, &uerr) {
		return uerr.Err
	}
	return err
}

// triggerChannel is what the commands that send requests to workers need of a channel.
type triggerChannel interface {
	trigger.Publisher
	// Declared reports whether a worker has declared the projection's subscription.
	Declared(ctx context.Context, projection string) (bool, error)
}

// publisher opens the channel --channel names; close releases it. It declares nothing: the
// workers declare their subscriptions, and the CLI publishes only to those.
func (c *cli) publisher(ctx context.Context, pool *pgxpool.Pool) (pub triggerChannel, closeFunc func(), err error) {
	switch c.g.channel {
	case channelAMQP:
		if c.g.amqp == "" {
			return nil, nil, usageErrorf("--channel amqp needs a RabbitMQ URL: set %s or pass --amqp amqp://user:password@host:5672/ (or use --channel postgres)", envAMQPURL)
		}
		ch, err := amqp.New(ctx, c.amqpConfig())
		if err != nil {
			return nil, nil, c.amqpError(err)
		}
		return ch, func() { _ = ch.Close() }, nil
	default:
		ch, err := chpg.New(pool, chpg.Config{Schema: c.g.schema})
		if err != nil {
			return nil, nil, err
		}
		return ch, func() { _ = ch.Close() }, nil
	}
}

// amqpConfig is the config of the CLI's RabbitMQ channel: one attempt to connect, bounded by
// connectTimeout like the database's.
func (c *cli) amqpConfig() amqp.Config {
	return amqp.Config{URL: c.g.amqp, Prefix: c.g.amqpPrefix, ConnectionName: "nudge-cli",
		StartupTimeout: connectTimeout, StartupAttempts: 1}
}

// amqpError says what went wrong connecting to RabbitMQ in terms of the command line.
func (c *cli) amqpError(err error) error {
	var (
		cfgErr  *amqp.ConfigError
		connErr *amqp.ConnectError
	)
	switch {
	case errors.As(err, &connErr) && errors.Is(err, context.Canceled):
		return fmt.Errorf("connect to RabbitMQ at %s: %w", connErr.URL, context.Canceled)
	case errors.As(err, &cfgErr):
		flagName := map[string]string{"URL": "--amqp", "Prefix": "--amqp-prefix"}[cfgErr.Field]
		if flagName == "" {
			return fmt.Errorf("RabbitMQ channel: %s", redact.Message(err.Error(), c.g.amqp))
		}
		return usageErrorf("%s %s", flagName, cfgErr.Problem) // never holds the password
	case errors.As(err, &connErr) && connErr.Refused:
		return fmt.Errorf("RabbitMQ at %s refused the connection: %s; check the user, password and vhost in --amqp or %s",
			connErr.URL, redact.Message(connErr.Reason, c.g.amqp), envAMQPURL)
	case errors.As(err, &connErr):
		return fmt.Errorf("cannot connect to RabbitMQ at %s (%s): %s; check that the broker runs and that --amqp or %s points at it, or use --channel postgres",
			connErr.URL, connErr.Tries(), redact.Message(connErr.Reason, c.g.amqp), envAMQPURL)
	}
	return fmt.Errorf("cannot connect to RabbitMQ at %s: %s", redact.URL(c.g.amqp), redact.Message(err.Error(), c.g.amqp))
}

// requireConsumer returns nil if a worker has declared the projection's subscription on the
// channel, and otherwise an error that names the channel (and its prefix or schema): a
// request there would wait forever, or, on RabbitMQ, in a queue nobody reads.
func (c *cli) requireConsumer(ctx context.Context, ch triggerChannel, name string) error {
	ok, err := ch.Declared(ctx, name)
	switch {
	case errors.Is(err, chpg.ErrNotMigrated):
		return c.noChannelTables(name)
	case err != nil:
		return fmt.Errorf("look up the subscription of projection %s on the %s channel: %w", name, c.g.channel, err)
	case ok:
		return nil
	}
	return c.noConsumer(ch, name)
}

// noConsumer is the error for a projection without a declared subscription on the channel.
func (c *cli) noConsumer(ch triggerChannel, name string) error {
	if q, ok := ch.(interface{ QueueName(string) string }); ok {
		return fmt.Errorf("no worker of projection %s consumes from the amqp channel with prefix %q: RabbitMQ has no queue %s, "+
			"so nothing would take the request. Check the projection's name ('nudge status' lists them) and --amqp-prefix "+
			"(or %s), which must be its workers' prefix; or use --channel postgres if it runs on PostgreSQL queues",
			name, c.g.amqpPrefix, q.QueueName(name), envAMQPPrefix)
	}
	return fmt.Errorf("no worker of projection %s has declared its subscription on the postgres channel in %s, "+
		"so nothing would take the request. Check the projection's name ('nudge status' lists them) and --schema, "+
		"start its worker, or use --channel amqp if it runs on RabbitMQ", name, c.schemaWhere())
}

// noChannelTables is the error for a postgres channel whose tables do not exist.
func (c *cli) noChannelTables(name string) error {
	return fmt.Errorf("the postgres channel has no tables in %s (no worker has run on it here), so nothing would take a request for "+
		"projection %s: start its worker, check --db and --schema, or use --channel amqp if it runs on RabbitMQ", c.schemaWhere(), name)
}

// schemaWhere names the database, and --schema if set.
func (c *cli) schemaWhere() string {
	if c.g.schema == "" {
		return "this database"
	}
	return fmt.Sprintf("schema %s of this database", c.g.schema)
}

// send publishes t to its projection on the channel, which a worker of the projection must
// have declared.
func (c *cli) send(ctx context.Context, ch triggerChannel, t trigger.Trigger) error {
	if err := ch.Publish(ctx, t); err != nil {
		if errors.Is(err, amqp.ErrNotDeclared) || errors.Is(err, chpg.ErrNotDeclared) {
			return c.noConsumer(ch, t.Projection)
		}
		if errors.Is(err, chpg.ErrNotMigrated) {
			return c.noChannelTables(t.Projection)
		}
		return fmt.Errorf("send the %s request to projection %s's worker on the %s channel: %w", t.Reason, t.Projection, c.g.channel, err)
	}
	return nil
}

// refuseRelay refuses the relay's name where a command needs a projection's worker.
func refuseRelay(cmd, name string) error {
	if name != relay.NameDefault {
		return nil
	}
	return usageErrorf("%s: %s is the trigger relay, not a projection: no worker takes requests for it and it has no read model; "+
		"name a projection ('nudge status' lists them)", cmd, name)
}
