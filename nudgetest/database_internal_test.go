package nudgetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestDropStaleTemplates: a run drops the templates of processes that have ended (nothing
// holds their lock), never one whose process still holds it, and leaves young test databases.
func TestDropStaleTemplates(t *testing.T) {
	t.Parallel()
	s := server(t, Options{}.url())
	ctx := context.Background()
	exists := func(name string) bool {
		var n int
		if err := s.admin.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = $1`, name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	create := func(name string) {
		if _, err := s.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = s.admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		})
	}
	now := time.Now().Unix()
	ended := fmt.Sprintf("%s%d_%s", templatePrefix, now, randomHex(4))
	held := fmt.Sprintf("%s%d_%s", templatePrefix, now, randomHex(4))
	young := fmt.Sprintf("%s%d_%s", namePrefix, now, randomHex(4))
	if err := s.holdTemplate(ctx, held); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{ended, held, young} {
		create(name)
	}
	dropStale(s.admin)
	for name, want := range map[string]bool{ended: false, held: true, young: true} {
		if got := exists(name); got != want {
			t.Errorf("database %s exists: %t, want %t", name, got, want)
		}
	}
}
