package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	amqpchannel "github.com/nudgeworks/nudge/channel/amqp"
	"github.com/nudgeworks/nudge/deadletter"
	dlpostgres "github.com/nudgeworks/nudge/deadletter/postgres"
	"github.com/nudgeworks/nudge/internal/backoff"
	"github.com/nudgeworks/nudge/internal/chaos/chaosmodel"
	"github.com/nudgeworks/nudge/name"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/trigger"
)

// badNames are projection names with SQL, AMQP or path metacharacters.
var badNames = []string{"x; DROP TABLE y", `a"b`, "amq.#", "q*", "../x"}

// runSecurity: hostile projection names, and secrets in every connection URL.
func runSecurity(ctx context.Context, e *env, r *result) error {
	if err := e.startAll(ctx); err != nil {
		return err
	}
	// The table the first name would drop.
	if _, err := e.pool.Exec(ctx, `CREATE TABLE y (id int)`); err != nil {
		return err
	}
	refuse := func(what string, err error, want error) {
		r.Faults++
		r.addCheck("refused: "+what, errors.Is(err, want), "%v", err)
	}
	// A channel and a dead-letter store that can reach nothing: a name that got past the
	// validation would fail with ErrClosed or a connection error instead of name.ErrInvalid.
	closedCh, err := amqpchannel.New(ctx, amqpchannel.Config{URL: e.s.broker.url, Prefix: e.prefix, ConnectionName: e.prefix + "closed"})
	if err != nil {
		return err
	}
	_ = closedCh.Close()
	closedPool, err := pgxpool.New(ctx, e.dbURL)
	if err != nil {
		return err
	}
	closedPool.Close()
	closedDead, err := dlpostgres.New(closedPool, dlpostgres.Config{})
	if err != nil {
		return err
	}
	for _, bad := range badNames {
		q := fmt.Sprintf("%q", bad)
		_, err := projection.New(bad, projection.Config{}, projection.OnIdempotent(chaosmodel.EventType,
			func(context.Context, projection.Event[chaosmodel.Payload]) error { return nil }))
		refuse("projection.New "+q, err, name.ErrInvalid)
		refuse("Declare "+q, e.channel.Declare(ctx, bad), name.ErrInvalid)
		refuse("Declare on a closed channel "+q, closedCh.Declare(ctx, bad), name.ErrInvalid)
		refuse("Publish to "+q+" on a closed channel", closedCh.Publish(ctx, trigger.Trigger{Projection: bad, Reason: trigger.ReasonReplay}), name.ErrInvalid)
		_, err = closedDead.List(ctx, deadletter.Filter{Projection: bad})
		refuse("dead letters of "+q+" on a closed pool", err, name.ErrInvalid)
		_, err = deadletter.Replay(ctx, closedDead, closedCh, deadletter.ReplayFilter{Projection: bad}, "chaos", time.Now())
		refuse("replay of "+q+" on a closed pool and channel", err, name.ErrInvalid)
	}
	// Controls: the closed channel and pool do refuse a valid name, for another reason.
	r.addCheck("control: the closed channel refuses a valid name", errors.Is(closedCh.Declare(ctx, "valid"), amqpchannel.ErrClosed), "")
	_, err = closedDead.List(ctx, deadletter.Filter{Projection: "valid"})
	r.addCheck("control: the closed pool fails a valid name", err != nil && !errors.Is(err, name.ErrInvalid), "%v", err)
	_, err = amqpchannel.New(ctx, amqpchannel.Config{URL: "amqp://guest:guest@127.0.0.1:1/", Prefix: "amq.#", StartupTimeout: time.Second})
	r.Faults++
	r.addCheck(`refused: amqp prefix "amq.#"`, err != nil && strings.Contains(err.Error(), "Prefix"), "%v", err)

	// The CLI, with a database it cannot reach: a bad name must be refused before it tries.
	pgSecret := "chaos-bad-pg-" + randomHex(6)
	unreachable := (&url.URL{Scheme: "postgres", User: url.UserPassword("postgres", pgSecret), Host: "127.0.0.1:1", Path: "/x"}).String()
	for i, bad := range badNames {
		for j, args := range [][]string{
			{"deadletter", "replay", "--projection", bad},
			{"deadletter", "list", "--projection", bad},
			{"skip", bad, "--event", uuid.NewString(), "--reason", "chaos"},
		} {
			out, code, err := e.s.runCLI(ctx, e, fmt.Sprintf("badname-%d-%d", i, j), append(args, "--db", unreachable), nil)
			if err != nil {
				return err
			}
			r.Faults++
			r.addCheck(fmt.Sprintf("CLI refuses %s %q", args[0]+" "+args[1], bad), code == 2 && strings.Contains(out, "invalid name"),
				"exit %d: %s", code, firstLine(out))
		}
	}
	// Wrong DSNs and a wrong broker password, with secrets in them, for the greps.
	amqpSecret := "chaos-bad-amqp-" + randomHex(6)
	badAMQP := withPassword(e.s.broker.url, amqpSecret)
	e.secrets = []string{e.s.pgPassword, pgSecret, amqpSecret}
	out, code, err := e.s.runCLI(ctx, e, "unreachable-db", []string{"deadletter", "list", "--db", unreachable}, nil)
	if err != nil {
		return err
	}
	r.Faults++
	r.addCheck("CLI: unreachable database", code == 1 && strings.Contains(out, "cannot reach PostgreSQL"), "exit %d: %s", code, firstLine(out))
	// A wrong password against the private cluster, which checks it (scram-sha-256).
	wrongPG := "chaos-wrong-pg-" + randomHex(6)
	e.secrets = append(e.secrets, wrongPG)
	wrongDB := e.s.cluster.URL(e.dbName, wrongPG)
	out, code, err = e.s.runCLI(ctx, e, "wrong-pg-password", []string{"deadletter", "list", "--db", wrongDB}, nil)
	if err != nil {
		return err
	}
	r.Faults++
	r.addCheck("CLI: wrong PostgreSQL password", code == 1 && strings.Contains(out, "password authentication failed"), "exit %d: %s", code, firstLine(out))
	out, code, err = e.s.runCLI(ctx, e, "wrong-amqp-password", []string{"deadletter", "replay", "--all", "--amqp", badAMQP}, nil)
	if err != nil {
		return err
	}
	r.Faults++
	r.addCheck("CLI: wrong broker password", code == 1 && strings.Contains(out, "RabbitMQ"), "exit %d: %s", code, firstLine(out))
	out, code, err = e.s.runCLI(ctx, e, "list", []string{"deadletter", "list"}, nil)
	if err != nil {
		return err
	}
	r.addCheck("CLI: list with a password in the URL", code == 0, "exit %d: %s", code, firstLine(out))
	for _, bad := range []struct{ label, dbURL, amqpURL string }{
		{"worker-unreachable-db", unreachable, e.s.broker.url},
		{"worker-wrong-amqp-password", e.dbURL, badAMQP},
		{"worker-wrong-pg-password", wrongDB, e.s.broker.url},
	} {
		code, logText, err := e.runDoomedWorker(ctx, bad.label, bad.dbURL, bad.amqpURL)
		if err != nil {
			return err
		}
		r.Faults++
		clear := code == 1 && strings.Contains(logText, "chaosworker failed")
		if bad.label == "worker-wrong-pg-password" {
			clear = clear && strings.Contains(logText, "password authentication failed")
		}
		r.addCheck(bad.label+" exits with a clear error", clear, "exit %d", code)
	}
	r.FaultKind = "hostile inputs"
	// Nothing was dropped or declared.
	var exists bool
	if err := e.pool.QueryRow(ctx, `SELECT to_regclass('y') IS NOT NULL`).Scan(&exists); err != nil {
		return err
	}
	r.addCheck("table y still exists", exists, "")
	queues, err := e.s.broker.queueNames(ctx, e.prefix)
	if err != nil {
		return err
	}
	var want []string
	for _, n := range chaosmodel.Names() {
		want = append(want, queueName(e.prefix, n))
	}
	var extra []string
	for _, q := range queues {
		if !contains(want, q) {
			extra = append(extra, q)
		}
	}
	r.addCheck("no queue declared for a bad name", len(extra) == 0, "unexpected queues: %v", extra)
	e.faultsOver()
	return backoff.Sleep(ctx, 3*time.Second)
}

// describeSecret names a generated password without showing it: its fixed prefix and length.
func describeSecret(secret string) string {
	i := strings.LastIndexByte(secret, '-')
	return fmt.Sprintf("the password %s<%d random characters>", secret[:i+1], len(secret)-i-1)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return cut(line, 160)
}

// withPassword returns rawURL with its password replaced by password.
func withPassword(rawURL, password string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return rawURL
	}
	u.User = url.UserPassword(u.User.Username(), password)
	return u.String()
}

// runDoomedWorker starts a worker process that cannot start and returns its exit code and log.
func (e *env) runDoomedWorker(ctx context.Context, label, dbURL, amqpURL string) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, deadline(60*time.Second))
	defer cancel()
	logPath := filepath.Join(e.logDir, label+".log")
	cmd := exec.CommandContext(ctx, e.s.workerBin, "-name", label, "-prefix", e.prefix, "-sink", filepath.Join(e.logDir, label+".sink"),
		"-startup-timeout", "2s")
	cmd.Env = append(os.Environ(), "CHAOS_DATABASE_URL="+dbURL, "CHAOS_AMQP_URL="+amqpURL)
	cmd.SysProcAttr = childAttr()
	out, err := cmd.CombinedOutput()
	code := 0
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		return 0, "", err
	}
	return code, string(out), os.WriteFile(logPath, out, 0o644)
}

// clearPasswordURL finds URLs with a password that is not redacted: scheme://user:password@.
var clearPasswordURL = regexp.MustCompile(`[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@"'\\]+:([^@\s/"'\\]+)@`)

// checkSecrets searches every output of the run so far (worker logs of every scenario, CLI
// outputs, the suite's own log) for the passwords and for URLs with a clear password.
func checkSecrets(_ context.Context, e *env, r *result) error {
	var files []string
	err := filepath.WalkDir(e.s.logDir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && (strings.HasSuffix(path, ".log") || strings.HasSuffix(path, ".out")) {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		return err
	}
	// The private PostgreSQL server's own log, and the private RabbitMQ node's, too.
	if _, err := os.Stat(e.s.cluster.LogPath()); err == nil {
		files = append(files, e.s.cluster.LogPath())
	}
	if e.s.rabbit != nil {
		logs, _ := filepath.Glob(filepath.Join(e.s.rabbit.Dir(), "log", "*.log"))
		files = append(files, logs...)
		files = append(files, filepath.Join(e.s.rabbit.Dir(), "server.out"))
	}
	type pattern struct {
		name  string
		match func(line string) bool
	}
	var patterns []pattern
	// The patterns are described, never printed: a printed secret would be a leak itself.
	for _, secret := range e.secrets {
		patterns = append(patterns, pattern{describeSecret(secret), func(l string) bool { return strings.Contains(l, secret) }})
	}
	if u, err := url.Parse(e.s.broker.url); err == nil {
		if pw, ok := u.User.Password(); ok {
			creds := u.User.Username() + ":" + pw + "@"
			patterns = append(patterns, pattern{"the broker URL's user:password@", func(l string) bool { return strings.Contains(l, creds) }})
		}
	}
	patterns = append(patterns, pattern{"/" + clearPasswordURL.String() + "/ with a password other than xxxxx", func(l string) bool {
		for _, m := range clearPasswordURL.FindAllStringSubmatch(l, -1) {
			if m[1] != "xxxxx" {
				return true
			}
		}
		return false
	}})
	results := make([]grepResult, len(patterns))
	for i, p := range patterns {
		results[i] = grepResult{Pattern: p.name, Files: len(files)}
	}
	for _, path := range files {
		if err := grepFile(path, func(n int, line string) {
			for i, p := range patterns {
				if p.match(line) {
					results[i].Hits++
					if len(results[i].Where) < 5 {
						results[i].Where = append(results[i].Where, fmt.Sprintf("%s:%d", path, n))
					}
				}
			}
		}); err != nil {
			return err
		}
	}
	r.Greps = results
	for _, g := range results {
		r.addCheck("grep "+g.Pattern, g.Hits == 0, "%d hits in %d files %v", g.Hits, g.Files, g.Where)
	}
	return nil
}

// grepFile calls match for every line of the file at path.
func grepFile(path string, match func(n int, line string)) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for n := 1; sc.Scan(); n++ {
		match(n, sc.Text())
	}
	return sc.Err()
}
