// Package rabbitcluster runs private RabbitMQ nodes, alone or clustered, for tests and the
// fault-injection suite: each node has its own node name, AMQP and distribution ports, data and
// log directories in a temporary directory, and an Erlang cookie that only the nodes of one
// cluster share. Only their owner connects to them, so stopping or killing one disturbs nobody;
// the shared broker on 5672 is untouched.
package rabbitcluster

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// dirPrefix starts the name of the temporary directory of every private node, so a later run
// can find and remove the nodes of a run that was killed.
const dirPrefix = "nudge-rabbit-"

// staleAfter is the age after which the directory of a node of another run is taken for a
// leftover of a killed run.
const staleAfter = time.Hour

// Bounds of a node's start and stop and of a CLI command, past which they fail: generous,
// since on a busy machine (a load of 40 on two cores) a CLI command that takes a second alone
// takes a minute. The context passed bounds them further.
const (
	// StartTimeout bounds a start of a node, boot included.
	StartTimeout = 3 * time.Minute
	// stopTimeout bounds the end of the node's process after rabbitmqctl stop.
	stopTimeout = time.Minute
	// ctlTimeout bounds one rabbitmqctl or rabbitmq-queues command.
	ctlTimeout = 3 * time.Minute
)

// ErrNoServer matches the error of Start when RabbitMQ's scripts are not installed.
var ErrNoServer = errors.New("rabbitcluster: rabbitmq-server was not found: install RabbitMQ (make tools) " +
	"or set NUDGE_TEST_RABBITMQ_BIN to the directory of its scripts")

// Options tune a private node.
type Options struct {
	// Name is the node's name before "@localhost". Defaults to "nudge-rabbit-" and a random
	// suffix.
	Name string
	// Cookie is the node's Erlang cookie: nodes join a cluster only if they share it. Defaults
	// to a random one.
	Cookie string
	// Logger receives a line when a leftover of a killed run is removed, or a node's directory
	// cannot be. Defaults to discarding them.
	Logger *slog.Logger
	// OpenFiles is the node's limit of open files (its soft RLIMIT_NOFILE). Defaults to
	// OpenFilesDefault; above the hard limit the node gets the hard limit. The node takes it
	// for its sockets and its queues' files: a node at its limit accepts no connection and
	// answers no declaration, so one with thousands of queues needs far more than the 1,024
	// a login shell often starts with.
	OpenFiles int
	// HandshakeTimeout is how long the node waits for a client's AMQP handshake (RabbitMQ's
	// handshake_timeout). Defaults to RabbitMQ's 10 s. A node starved of CPU (thousands of
	// queues on two loaded cores) can itself take longer than that to answer: raise it there,
	// with the clients' connection_timeout.
	HandshakeTimeout time.Duration
}

// OpenFilesDefault is a private node's limit of open files unless Options.OpenFiles says
// otherwise: RabbitMQ's production checklist asks for at least 50,000.
const OpenFilesDefault = 65536

// Node is a private RabbitMQ node.
type Node struct {
	dir      string
	name     string // e.g. nudge-rabbit-1a2b3c4d@localhost
	cookie   string
	port     int // AMQP
	distPort int
	server   string // rabbitmq-server script
	files    int    // the soft limit of open files asked for (Options.OpenFiles)
	// handshakeTimeout is Options.HandshakeTimeout (0: RabbitMQ's default).
	handshakeTimeout time.Duration
	bin              string // directory of RabbitMQ's scripts
	log              *slog.Logger

	cmd  *exec.Cmd
	done chan struct{} // closed once cmd has been waited for
}

// scripts finds the directory of RabbitMQ's own scripts, which run as the calling user (the
// Debian wrappers in /usr/sbin switch to the rabbitmq user and its cookie).
func scripts() (string, error) {
	for _, dir := range []string{os.Getenv("NUDGE_TEST_RABBITMQ_BIN"), "/usr/lib/rabbitmq/bin"} {
		if dir == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "rabbitmq-server")); err == nil {
			return dir, nil
		}
	}
	if server, err := exec.LookPath("rabbitmq-server"); err == nil {
		return filepath.Dir(server), nil
	}
	return "", ErrNoServer
}

// Start creates a node's directory and starts the node; it returns once the node accepts AMQP
// connections. Remove the node when done.
func Start(ctx context.Context, opts Options) (*Node, error) {
	bin, err := scripts()
	if err != nil {
		return nil, err
	}
	log := cmp.Or(opts.Logger, slog.New(slog.DiscardHandler))
	removeStale(log)
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, err
	}
	n := &Node{
		dir:              dir,
		name:             cmp.Or(opts.Name, dirPrefix+randomHex(4)) + "@localhost",
		cookie:           cmp.Or(opts.Cookie, randomHex(16)),
		server:           filepath.Join(bin, "rabbitmq-server"),
		files:            cmp.Or(opts.OpenFiles, OpenFilesDefault),
		handshakeTimeout: opts.HandshakeTimeout,
		bin:              bin,
		log:              log,
	}
	if err := n.prepare(); err != nil {
		n.Remove()
		return nil, err
	}
	if err := n.Start(ctx); err != nil {
		n.Remove()
		return nil, err
	}
	return n, nil
}

// prepare writes the node's files and picks its ports.
func (n *Node) prepare() error {
	conf := "log.file.level = info\n"
	if n.handshakeTimeout > 0 {
		conf += fmt.Sprintf("handshake_timeout = %d\n", n.handshakeTimeout.Milliseconds())
	}
	files := map[string]string{
		"rabbitmq.conf":   conf,
		"enabled_plugins": "[].\n", // no management plugin: a faster boot
		"env.conf":        "",      // not the machine's rabbitmq-env.conf, which names the shared node
		".erlang.cookie":  n.cookie,
	}
	for name, text := range files {
		mode := os.FileMode(0o600)
		if name == ".erlang.cookie" {
			mode = 0o400 // Erlang refuses a cookie that others may read
		}
		if err := os.WriteFile(filepath.Join(n.dir, name), []byte(text), mode); err != nil {
			return err
		}
	}
	var err error
	if n.port, err = freeTCPPort(); err == nil {
		n.distPort, err = freeTCPPort()
	}
	return err
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// freeTCPPort returns a TCP port on 127.0.0.1 that nothing listens on now.
func freeTCPPort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	return port, ln.Close()
}

// Name is the node's name, e.g. "nudge-rabbit-1a2b3c4d@localhost".
func (n *Node) Name() string { return n.name }

// Port is the node's AMQP port on 127.0.0.1.
func (n *Node) Port() int { return n.port }

// Dir is the node's directory: server.out (the server's output), log/ and mnesia/.
func (n *Node) Dir() string { return n.dir }

// URL is the node's AMQP URL, as the default user guest, which a fresh node has.
func (n *Node) URL() string {
	return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", n.port)
}

// env is the environment of the node's scripts: its own HOME (so its own Erlang cookie), name,
// ports and directories.
func (n *Node) env() []string {
	return append(os.Environ(),
		"HOME="+n.dir,
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(n.dir, "env.conf"),
		"RABBITMQ_NODENAME="+n.name,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(n.port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(n.distPort),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(n.dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(n.dir, "log"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(n.dir, "rabbitmq.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(n.dir, "enabled_plugins"),
		"ERL_EPMD_ADDRESS=127.0.0.1",
		`ERL_FLAGS=-kernel inet_dist_use_interface {127,0,0,1}`,
	)
}

// Start starts the node (again, after Stop or Kill) in a process group of its own and waits
// until it accepts AMQP connections, up to StartTimeout.
func (n *Node) Start(ctx context.Context) error {
	if n.done != nil {
		select {
		case <-n.done:
		default:
			return fmt.Errorf("rabbitcluster: node %s already runs", n.name)
		}
	}
	out, err := os.OpenFile(filepath.Join(n.dir, "server.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	// The server starts under a shell that sets its limit of open files: the limit a process
	// inherits is its starter's, which Go's os/exec leaves at what this process started with.
	cmd := exec.Command("/bin/sh", "-c", openFilesScript, n.server, strconv.Itoa(n.files))
	cmd.Env = n.env()
	cmd.Dir = n.dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		return fmt.Errorf("rabbitcluster: start node %s: %w", n.name, err)
	}
	_ = os.WriteFile(filepath.Join(n.dir, "pgid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600)
	done := make(chan struct{})
	n.cmd, n.done = cmd, done
	go func() {
		_ = cmd.Wait()
		_ = out.Close()
		close(done)
	}()
	return n.awaitAMQP(ctx)
}

// openFilesScript runs $0 (the server) with a soft limit of open files of $1, or of the hard
// limit when $1 is above it.
const openFilesScript = `ulimit -Sn "$1" 2>/dev/null || ulimit -Sn "$(ulimit -Hn)"; exec "$0"`

// awaitAMQP waits until the node accepts an AMQP connection, up to StartTimeout.
func (n *Node) awaitAMQP(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	for {
		conn, err := amqp091.DialConfig(n.URL(), amqp091.Config{Dial: amqp091.DefaultDial(5 * time.Second)})
		if err == nil {
			return conn.Close()
		}
		select {
		case <-n.done:
			return fmt.Errorf("rabbitcluster: node %s exited while starting; see %s", n.name, filepath.Join(n.dir, "server.out"))
		case <-ctx.Done():
			return fmt.Errorf("rabbitcluster: node %s did not accept connections within %s (see %s): %w",
				n.name, StartTimeout, filepath.Join(n.dir, "server.out"), ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Ctl runs rabbitmqctl against the node and returns its output.
func (n *Node) Ctl(ctx context.Context, args ...string) (string, error) {
	return n.script(ctx, "rabbitmqctl", args...)
}

// Queues runs rabbitmq-queues (quorum_status, add_member, …) against the node.
func (n *Node) Queues(ctx context.Context, args ...string) (string, error) {
	return n.script(ctx, "rabbitmq-queues", args...)
}

// script runs one of RabbitMQ's CLI scripts against the node, up to ctlTimeout.
func (n *Node) script(ctx context.Context, program string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, ctlTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(n.bin, program), append([]string{"-n", n.name}, args...)...)
	cmd.Env = n.env()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("rabbitcluster: %s -n %s %s: %w: %s", program, n.name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Stop stops the node gracefully (rabbitmqctl stop) and waits for its process to end.
func (n *Node) Stop(ctx context.Context) error {
	if n.cmd == nil {
		return nil
	}
	if _, err := n.Ctl(ctx, "stop"); err != nil {
		return err
	}
	select {
	case <-n.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(stopTimeout):
		return fmt.Errorf("rabbitcluster: node %s still runs %s after rabbitmqctl stop", n.name, stopTimeout)
	}
}

// Kill SIGKILLs the node's process group (the script and the Erlang VM) and waits for it.
func (n *Node) Kill() {
	if n.cmd == nil {
		return
	}
	_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
	<-n.done
}

// Remove kills the node and deletes its directory.
func (n *Node) Remove() {
	n.Kill()
	if err := os.RemoveAll(n.dir); err != nil {
		n.log.Warn("rabbitcluster: removing a private RabbitMQ node failed", slog.String("dir", n.dir), slog.Any("error", err))
	}
}

// removeStale kills and removes the nodes of earlier runs that were killed before their
// clean-up: directories starting with dirPrefix, over staleAfter old.
func removeStale(log *slog.Logger) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		info, err := os.Stat(dir)
		if err != nil || time.Since(info.ModTime()) < staleAfter {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(dir, "pgid")); err == nil {
			// Only a process group whose leader still runs this node's script.
			pgid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			if env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pgid)); pgid > 0 && err == nil && strings.Contains(string(env), "HOME="+dir+"\x00") {
				_ = syscall.Kill(-pgid, syscall.SIGKILL)
			}
		}
		_ = os.RemoveAll(dir)
		log.Info("rabbitcluster: removed the private RabbitMQ node of an earlier run", slog.String("dir", dir))
	}
}
