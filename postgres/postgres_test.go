package postgres_test

import (
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/postgres"
)

// A pool is what every component takes.
var _ postgres.DB = (*pgxpool.Pool)(nil)
