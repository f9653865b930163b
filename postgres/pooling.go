package postgres

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrSessionNeeded is matched (errors.Is) by the errors a part returns at start when it is told
// that its database handle goes through a connection pooler in transaction mode (PgBouncer's
// pool_mode = transaction), where no session outlives a transaction, and it is configured to
// use one: named prepared statements (pgx's default statement cache) or LISTEN on that handle.
// The message says what to set.
var ErrSessionNeeded = errors.New("postgres: needs a session of its own, which a pooler in transaction mode does not keep")

// CheckTransactionPooling returns an error matching ErrSessionNeeded when db is a pool (or a
// connection) whose statements are prepared by name once per connection — pgx's default,
// QueryExecModeCacheStatement: behind a pooler in transaction mode a client connection runs on
// whichever server connection is free, where its prepared statements do not exist (or another
// client's do, under the same name). PgBouncer 1.21 and later can track them
// (max_prepared_statements); nudge does not rely on it. A handle it cannot inspect (a
// transaction) passes.
func CheckTransactionPooling(db DB) error {
	var mode pgx.QueryExecMode
	switch h := db.(type) {
	case interface{ Config() *pgxpool.Config }:
		mode = h.Config().ConnConfig.DefaultQueryExecMode
	case interface{ Config() *pgx.ConnConfig }:
		mode = h.Config().DefaultQueryExecMode
	default:
		return nil
	}
	if mode == pgx.QueryExecModeCacheStatement {
		return fmt.Errorf("%w: the pool prepares named statements per connection (pgx's default query exec mode, %s): "+
			"add default_query_exec_mode=cache_describe to its URL, or set ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe",
			ErrSessionNeeded, mode)
	}
	return nil
}
