package nudgetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestDropStaleTemplates: a run drops the templates of processes that have ended (nothing
// holds their lock), never one whose process still holds it, in whichever database its
// connection is, and leaves young test databases.
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
	// A process whose server URL names another database holds its template's lock there:
	// advisory locks belong to a database, and go test runs packages' processes side by side.
	heldElsewhere := fmt.Sprintf("%s%d_%s", templatePrefix, now, randomHex(4))
	elsewhere := fmt.Sprintf("%s%d_%s", namePrefix, now, randomHex(4))
	create(elsewhere)
	u, err := setDatabase(s.url, elsewhere)
	if err != nil {
		t.Fatal(err)
	}
	other := &srv{url: u}
	if err := other.holdTemplate(ctx, heldElsewhere); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range other.holders {
			_ = c.Close(context.Background())
		}
	})
	for _, name := range []string{ended, held, heldElsewhere, young} {
		create(name)
	}
	dropStale(s.admin)
	for name, want := range map[string]bool{ended: false, held: true, heldElsewhere: true, young: true} {
		if got := exists(name); got != want {
			t.Errorf("database %s exists: %t, want %t", name, got, want)
		}
	}
}
