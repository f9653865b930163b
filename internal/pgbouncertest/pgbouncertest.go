// Package pgbouncertest starts a private PgBouncer in transaction pooling mode in front of a
// test's database, for tests that run nudge through it.
package pgbouncertest

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// Options tune a PgBouncer.
type Options struct {
	// PoolSize is default_pool_size: how many server connections PgBouncer opens to the
	// database at most. Defaults to 10.
	PoolSize int
	// MaxPreparedStatements, if positive, sets max_prepared_statements (PgBouncer 1.21 and
	// later; older versions refuse to start with it).
	MaxPreparedStatements int
}

// Bouncer is a running PgBouncer.
type Bouncer struct {
	// URL connects to the database through PgBouncer.
	URL string
	// Version is what `pgbouncer --version` printed first, e.g. "PgBouncer 1.18.0".
	Version string
}

// Start starts PgBouncer in transaction pooling mode in front of the database directURL names
// (a postgres:// URL with host, port, user and database), listening on a free port of
// 127.0.0.1, and stops it when t ends. Where pgbouncer is not installed the test is skipped,
// unless CI=true, where it fails: scripts/tools.sh installs it.
func Start(t testing.TB, directURL string, opts Options) *Bouncer {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		msg := "pgbouncertest: pgbouncer is not installed (scripts/tools.sh installs it, or apt-get install pgbouncer)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	u, err := url.Parse(directURL)
	if err != nil {
		t.Fatalf("pgbouncertest: parse the database URL: %v", err)
	}
	dir := t.TempDir()
	port, err := freePort()
	if err != nil {
		t.Fatalf("pgbouncertest: free port: %v", err)
	}
	user := u.User.Username()
	db := strings.TrimPrefix(u.Path, "/")
	ini := config(u, dir, port, opts)
	if err := os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "users.txt"), []byte(fmt.Sprintf("%q %q\n", user, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	version, _ := exec.Command(bin, "--version").Output()
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	if os.Getuid() == 0 {
		cmd.Args = append(cmd.Args, "-u", "nobody") // pgbouncer refuses to run as root
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"pgbouncer.ini", "users.txt"} {
			if err := os.Chmod(filepath.Join(dir, f), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	out := testlog.NewWriter(t)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("pgbouncertest: start pgbouncer: %v", err)
	}
	var waitErr error // set before exited closes
	exited := make(chan struct{})
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	b := &Bouncer{
		URL:     fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", url.PathEscape(user), port, url.PathEscape(db)),
		Version: strings.TrimSpace(strings.SplitN(string(version), "\n", 2)[0]),
	}
	awaitAccepting(t, b.URL, exited, func() error { return waitErr })
	return b
}

// config is pgbouncer.ini: one database, transaction pooling, trust.
func config(u *url.URL, dir string, port int, opts Options) string {
	host, dbPort := u.Hostname(), u.Port()
	if dbPort == "" {
		dbPort = "5432"
	}
	poolSize := opts.PoolSize
	if poolSize <= 0 {
		poolSize = 10
	}
	var b strings.Builder
	fmt.Fprintf(&b, "[databases]\n%s = host=%s port=%s dbname=%s\n\n", strings.TrimPrefix(u.Path, "/"), host, dbPort, strings.TrimPrefix(u.Path, "/"))
	fmt.Fprintf(&b, "[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = %d\nunix_socket_dir =\n", port)
	fmt.Fprintf(&b, "auth_type = trust\nauth_file = %s\npool_mode = transaction\n", filepath.Join(dir, "users.txt"))
	fmt.Fprintf(&b, "default_pool_size = %d\nmax_client_conn = 500\nlogfile =\npidfile =\n", poolSize)
	b.WriteString("ignore_startup_parameters = extra_float_digits,options\nlog_connections = 0\nlog_disconnections = 0\n")
	if opts.MaxPreparedStatements > 0 {
		fmt.Fprintf(&b, "max_prepared_statements = %d\n", opts.MaxPreparedStatements)
	}
	return b.String()
}

// awaitAccepting waits until a query through PgBouncer answers.
func awaitAccepting(t testing.TB, url string, exited <-chan struct{}, waitErr func() error) {
	t.Helper()
	ctx := testwait.Context(t, 30*time.Second)
	for {
		select {
		case <-exited:
			t.Fatalf("pgbouncertest: pgbouncer exited at start: %v (its output is above)", waitErr())
		default:
		}
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			var one int
			err = conn.QueryRow(ctx, "SELECT 1", pgx.QueryExecModeSimpleProtocol).Scan(&one)
			_ = conn.Close(ctx)
			if err == nil {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pgbouncertest: pgbouncer at %s does not answer: %v", url, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// freePort returns a TCP port on 127.0.0.1 that nothing listens on now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	return port, ln.Close()
}
