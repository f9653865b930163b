// Package pgcluster runs private PostgreSQL clusters for tests and the fault-injection suite: a
// server of its own in a temporary directory, on a free port, that only its owner connects to,
// so stopping, crashing or pausing it (a debugger on one of its backends) disturbs nobody else.
package pgcluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clusterDirPrefix starts the name of the temporary directory of every private cluster, so a
// later run can find and remove the cluster of a run that was killed.
const clusterDirPrefix = "nudge-chaos-pg-"

// Cluster is a private PostgreSQL cluster in a temporary directory, run as the postgres OS user
// on 127.0.0.1 and a free port, with trust authentication or a password (Options.Password). Only this suite connects to it, so
// restarting it disturbs nobody.
type Cluster struct {
	bin      string // directory of initdb, pg_ctl, postgres
	dir      string // temporary directory: data/, the socket, server.log
	maxConns int
	prepared int // max_prepared_transactions
	durable  bool
	password string // "" for trust authentication
	port     int
	runAs    string // OS user the server runs as; "" when not root
	log      *slog.Logger
	logged   string        // server log path
	timeout  time.Duration // bound on each program run (Options.ProgramTimeout)
}

// findPGBin returns the directory of PostgreSQL's server programs.
func findPGBin() (string, error) {
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(dir, "pg_ctl")); err == nil {
			return dir, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	if len(matches) > 0 {
		return filepath.Dir(matches[len(matches)-1]), nil // the newest version sorts last
	}
	if path, err := exec.LookPath("pg_ctl"); err == nil {
		return filepath.Dir(path), nil
	}
	return "", errors.New("PostgreSQL's server programs (initdb, pg_ctl) were not found: install the server package " +
		"(e.g. postgresql-15) or put its bin directory on the PATH")
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

// Options tune a private cluster.
type Options struct {
	// MaxConnections is the server's max_connections. Defaults to MaxConnectionsDefault.
	MaxConnections int
	// Durable runs the server with fsync=on and full_page_writes=on, as production does, so an
	// immediate stop (a crash) is recovered from the WAL as after a real one. Off by default:
	// the tests that only stop processes need no flushes on a shared machine.
	Durable bool
	// Password, when set, makes the cluster require it for every TCP connection of the user
	// postgres (scram-sha-256 in pg_hba.conf, password_encryption=scram-sha-256); the socket
	// stays trust for the suite's own administration. Empty: trust everywhere.
	Password string
	// MaxPreparedTransactions is the server's max_prepared_transactions, for tests of two-phase
	// commit. Defaults to 0, PostgreSQL's default: PREPARE TRANSACTION fails.
	MaxPreparedTransactions int
	// ProgramTimeout bounds each run of initdb and pg_ctl (and pg_ctl's own wait for the
	// server): on a busy machine initdb alone can take over a minute. Defaults to
	// ProgramTimeoutDefault.
	ProgramTimeout time.Duration
}

// ProgramTimeoutDefault is Options.ProgramTimeout's default.
const ProgramTimeoutDefault = 60 * time.Second

// MaxConnectionsDefault is the max_connections of a private cluster.
const MaxConnectionsDefault = 200

// New creates (initdb) and starts a private cluster. Remove it when done.
func New(ctx context.Context, log *slog.Logger) (*Cluster, error) {
	return NewWith(ctx, log, Options{})
}

// NewWith is New with options.
func NewWith(ctx context.Context, log *slog.Logger, opts Options) (*Cluster, error) {
	bin, err := findPGBin()
	if err != nil {
		return nil, err
	}
	removeStaleClusters(ctx, bin, log)
	dir, err := os.MkdirTemp("", clusterDirPrefix)
	if err != nil {
		return nil, err
	}
	c := &Cluster{bin: bin, dir: dir, log: log, logged: filepath.Join(dir, "server.log"),
		maxConns: cmp.Or(opts.MaxConnections, MaxConnectionsDefault), durable: opts.Durable, password: opts.Password,
		prepared: opts.MaxPreparedTransactions, timeout: cmp.Or(opts.ProgramTimeout, ProgramTimeoutDefault)}
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root: hand the directory to the postgres user.
		c.runAs = "postgres"
		u, err := user.Lookup(c.runAs)
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root needs the OS user postgres to run PostgreSQL as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
	if c.port, err = freePort(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if err := c.initdb(ctx); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		c.Remove(context.WithoutCancel(ctx))
		return nil, err
	}
	return c, nil
}

// initdb creates the data directory: trust authentication, or with a password scram-sha-256
// for TCP (the password goes through a file of the temporary directory, never a command line).
func (c *Cluster) initdb(ctx context.Context) error {
	args := []string{"-D", c.Data(), "-U", "postgres", "-E", "UTF8", "--no-sync", "--no-instructions"}
	if c.password == "" {
		args = append(args, "-A", "trust")
	} else {
		pwFile := filepath.Join(c.dir, "pwfile")
		if err := os.WriteFile(pwFile, []byte(c.password+"\n"), 0o600); err != nil {
			return err
		}
		if err := c.chown(pwFile); err != nil {
			return err
		}
		defer func() { _ = os.Remove(pwFile) }()
		args = append(args, "--auth-local=trust", "--auth-host=scram-sha-256", "--pwfile="+pwFile)
	}
	_, err := c.run(ctx, "initdb", args...)
	return err
}

// chown gives path to the OS user the server runs as (nothing when not root).
func (c *Cluster) chown(path string) error {
	if c.runAs == "" {
		return nil
	}
	u, err := user.Lookup(c.runAs)
	if err != nil {
		return err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return os.Chown(path, uid, gid)
}

// removeStaleClusters stops and removes the clusters of earlier runs that were killed before
// their clean-up (their directories start with clusterDirPrefix and are over an hour old).
func removeStaleClusters(ctx context.Context, bin string, log *slog.Logger) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), clusterDirPrefix+"*"))
	for _, dir := range dirs {
		info, err := os.Stat(dir)
		if err != nil || time.Since(info.ModTime()) < time.Hour {
			continue
		}
		stale := &Cluster{bin: bin, dir: dir, log: log}
		if os.Geteuid() == 0 {
			stale.runAs = "postgres"
		}
		stale.Remove(ctx)
		log.Info("removed the private PostgreSQL cluster of an earlier run", slog.String("dir", dir))
	}
}

// Data returns the cluster's data directory.
func (c *Cluster) Data() string { return filepath.Join(c.dir, "data") }

// run runs one of PostgreSQL's programs, as c.runAs when set, and returns its output.
func (c *Cluster) run(ctx context.Context, program string, args ...string) (string, error) {
	name := filepath.Join(c.bin, program)
	if c.runAs != "" {
		args = append([]string{"-u", c.runAs, "--", name}, args...)
		name = "runuser"
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = c.dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", program, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// waitSeconds is pg_ctl's -t: the program's timeout, in whole seconds.
func (c *Cluster) waitSeconds() string { return strconv.Itoa(max(int(c.timeout/time.Second), 1)) }

// Start starts the server and waits until it accepts connections. fsync and full_page_writes
// are off unless Options.Durable: most tests inject process stops, never a lost page cache,
// and the machine is shared.
func (c *Cluster) Start(ctx context.Context) error {
	durability := "-c fsync=off -c full_page_writes=off"
	if c.durable {
		durability = "-c fsync=on -c full_page_writes=on"
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 %s -c password_encryption=scram-sha-256 "+
		"-c max_connections=%d -c max_prepared_transactions=%d -c shared_buffers=64MB", c.port, c.dir, durability, c.maxConns, c.prepared)
	_, err := c.run(ctx, "pg_ctl", "-D", c.Data(), "-o", opts, "-l", c.logged, "-w", "-t", c.waitSeconds(), "start")
	return err
}

// Stop shuts the server down with the given mode (fast: roll back open transactions,
// disconnect every client, checkpoint).
func (c *Cluster) Stop(ctx context.Context, mode string) error {
	_, err := c.run(ctx, "pg_ctl", "-D", c.Data(), "-m", mode, "-w", "-t", c.waitSeconds(), "stop")
	return err
}

// Running reports whether the server runs.
func (c *Cluster) Running(ctx context.Context) bool {
	_, err := c.run(ctx, "pg_ctl", "-D", c.Data(), "status")
	return err == nil
}

// EnsureRunning starts the server if a scenario left it stopped.
func (c *Cluster) EnsureRunning(ctx context.Context) error {
	if c.Running(ctx) {
		return nil
	}
	c.log.Warn("the private PostgreSQL cluster was stopped; starting it again")
	return c.Start(ctx)
}

// Remove stops the server (immediately) and deletes its directory.
func (c *Cluster) Remove(ctx context.Context) {
	if _, err := os.Stat(filepath.Join(c.Data(), "postmaster.pid")); err == nil {
		if err := c.Stop(ctx, "immediate"); err != nil {
			c.log.Warn("stopping the private PostgreSQL cluster failed", slog.Any("error", err))
		}
	}
	if err := os.RemoveAll(c.dir); err != nil {
		c.log.Warn("removing the private PostgreSQL cluster failed", slog.String("dir", c.dir), slog.Any("error", err))
	}
}

// URL returns the URL of database db on the cluster, with password as the password: the
// cluster's own with Options.Password (scram-sha-256 checks it), any other fails to
// authenticate; with trust authentication it is ignored. The chaos suite's security scenario
// looks for it in every output.
func (c *Cluster) URL(db, password string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword("postgres", password), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)),
		Path: "/" + db, RawQuery: "sslmode=disable"}
	return u.String()
}

// Port returns the TCP port the server listens on (127.0.0.1).
func (c *Cluster) Port() int { return c.port }

// LogPath returns the server's log file.
func (c *Cluster) LogPath() string { return c.logged }
