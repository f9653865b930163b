package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/channel/amqp"
	chpg "github.com/nudgeworks/nudge/channel/postgres"
	"github.com/nudgeworks/nudge/internal/redact"
	"github.com/nudgeworks/nudge/trigger"
)

// Timeouts of the connections the CLI opens.
const (
	connectTimeout     = 5 * time.Second
	amqpStartupTimeout = 10 * time.Second
)

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

// publisher opens the channel --channel names; close releases it.
func (c *cli) publisher(ctx context.Context, pool *pgxpool.Pool) (pub trigger.Publisher, closeFunc func(), err error) {
	switch c.g.channel {
	case channelAMQP:
		if c.g.amqp == "" {
			return nil, nil, usageErrorf("--channel amqp needs a RabbitMQ URL: set %s or pass --amqp amqp://user:password@host:5672/ (or use --channel postgres)", envAMQPURL)
		}
		ch, err := amqp.New(ctx, amqp.Config{URL: c.g.amqp, Prefix: c.g.amqpPrefix, ConnectionName: "nudge-cli", StartupTimeout: amqpStartupTimeout})
		if err != nil {
			return nil, nil, fmt.Errorf("cannot connect to RabbitMQ at %s: %s; check --amqp or %s, or use --channel postgres",
				redact.URL(c.g.amqp), redact.Message(err.Error(), c.g.amqp), envAMQPURL)
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
