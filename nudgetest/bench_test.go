package nudgetest_test

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/nudgetest"
	"github.com/nudgeworks/nudge/postgres"
)

// BenchmarkDatabase compares a test's database setup: a copy of the migrated template
// (Database) against a new database migrated for the test, as without the kit. Run it with
// -benchtime=20x: the databases are dropped when the benchmark ends.
func BenchmarkDatabase(b *testing.B) {
	b.Run("template", func(b *testing.B) {
		nudgetest.Database(b, nudgetest.Options{}) // builds the template once
		b.ResetTimer()
		for range b.N {
			nudgetest.Database(b, nudgetest.Options{})
		}
	})
	b.Run("migrate", func(b *testing.B) {
		admin := nudgetest.Database(b, nudgetest.Options{}) // a connection to the server
		ctx := context.Background()
		b.ResetTimer()
		for i := range b.N {
			name := fmt.Sprintf("nudgetest_%d_bench%d", time.Now().Unix(), i)
			if _, err := admin.Pool.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				_, _ = admin.Pool.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
			})
			u, _ := url.Parse(admin.URL)
			u.Path = "/" + name
			pool, err := pgxpool.New(ctx, u.String())
			if err != nil {
				b.Fatal(err)
			}
			if err := postgres.Migrate(ctx, pool, ""); err != nil {
				b.Fatal(err)
			}
			pool.Close()
		}
	})
}
