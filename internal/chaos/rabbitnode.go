package main

import (
	"context"
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
)

// rabbitDirPrefix starts the name of the temporary directory of every private RabbitMQ node,
// so a later run can find and remove the node of a run that was killed.
const rabbitDirPrefix = "nudge-chaos-rabbit-"

// rabbitStartTimeout bounds a start of the private node, boot included.
const rabbitStartTimeout = 90 * time.Second

// rabbitNode is a RabbitMQ node of the suite's own: its own node name, AMQP and distribution
// ports, mnesia and log directories and Erlang cookie, in a temporary directory. Only the
// broker-restart scenario connects to it, so stopping or killing it disturbs nobody; the shared
// broker on 5672 is untouched.
type rabbitNode struct {
	dir      string
	node     string // nudge-chaos-<run>@localhost
	port     int    // AMQP
	distPort int
	server   string // rabbitmq-server script
	ctl      string // rabbitmqctl script
	log      *slog.Logger

	cmd  *exec.Cmd
	done chan struct{} // closed once cmd has been waited for
}

// rabbitScripts finds rabbitmq-server and rabbitmqctl: RabbitMQ's own scripts, which run as the
// calling user (the Debian wrappers in /usr/sbin switch to the rabbitmq user and its cookie).
func rabbitScripts() (server, ctl string, err error) {
	for _, dir := range []string{os.Getenv("NUDGE_TEST_RABBITMQ_BIN"), "/usr/lib/rabbitmq/bin"} {
		if dir == "" {
			continue
		}
		server, ctl = filepath.Join(dir, "rabbitmq-server"), filepath.Join(dir, "rabbitmqctl")
		if _, err := os.Stat(server); err == nil {
			return server, ctl, nil
		}
	}
	if server, err = exec.LookPath("rabbitmq-server"); err == nil {
		if ctl, err = exec.LookPath("rabbitmqctl"); err == nil {
			return server, ctl, nil
		}
	}
	return "", "", errors.New("rabbitmq-server was not found: install RabbitMQ or set NUDGE_TEST_RABBITMQ_BIN to the directory of its scripts")
}

// newRabbitNode creates the node's directory and starts it.
func newRabbitNode(ctx context.Context, runID string, log *slog.Logger) (*rabbitNode, error) {
	server, ctl, err := rabbitScripts()
	if err != nil {
		return nil, err
	}
	removeStaleRabbitNodes(log)
	dir, err := os.MkdirTemp("", rabbitDirPrefix)
	if err != nil {
		return nil, err
	}
	n := &rabbitNode{dir: dir, node: "nudge-chaos-" + runID + "@localhost", server: server, ctl: ctl, log: log}
	files := map[string]string{
		"rabbitmq.conf":   "log.file.level = info\n",
		"enabled_plugins": "[].\n", // no management plugin: a faster boot
		"env.conf":        "",      // not the machine's rabbitmq-env.conf, which names the shared node
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
	if n.port, err = freeTCPPort(); err == nil {
		n.distPort, err = freeTCPPort()
	}
	if err == nil {
		err = n.start(ctx)
	}
	if err != nil {
		n.remove()
		return nil, err
	}
	return n, nil
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

// env is the environment of the node's scripts: its own HOME (so its own Erlang cookie), name,
// ports and directories.
func (n *rabbitNode) env() []string {
	return append(os.Environ(),
		"HOME="+n.dir,
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(n.dir, "env.conf"),
		"RABBITMQ_NODENAME="+n.node,
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

// url is the node's AMQP URL (the default user guest, which a fresh node has).
func (n *rabbitNode) url() string {
	return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", n.port)
}

// start starts the node in a process group of its own and waits until it accepts AMQP
// connections.
func (n *rabbitNode) start(ctx context.Context) error {
	out, err := os.OpenFile(filepath.Join(n.dir, "server.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(n.server)
	cmd.Env = n.env()
	cmd.Dir = n.dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		return fmt.Errorf("start the private RabbitMQ node: %w", err)
	}
	_ = os.WriteFile(filepath.Join(n.dir, "pgid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600)
	n.cmd, n.done = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = out.Close()
		close(n.done)
	}()
	return n.awaitAMQP(ctx)
}

// awaitAMQP waits until the node accepts an AMQP connection, up to rabbitStartTimeout.
func (n *rabbitNode) awaitAMQP(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, rabbitStartTimeout)
	defer cancel()
	b := &broker{url: n.url()}
	for {
		if err := b.ping(); err == nil {
			return nil
		}
		select {
		case <-n.done:
			return fmt.Errorf("the private RabbitMQ node %s exited while starting; see %s", n.node, filepath.Join(n.dir, "server.out"))
		case <-ctx.Done():
			return fmt.Errorf("the private RabbitMQ node %s did not accept connections within %s: %w", n.node, rabbitStartTimeout, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// ctlRun runs rabbitmqctl against the node.
func (n *rabbitNode) ctlRun(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, n.ctl, append([]string{"-n", n.node}, args...)...)
	cmd.Env = n.env()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("rabbitmqctl -n %s %s: %w: %s", n.node, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// stopGracefully stops the node with rabbitmqctl stop and waits for its process to end.
func (n *rabbitNode) stopGracefully(ctx context.Context) error {
	if _, err := n.ctlRun(ctx, "stop"); err != nil {
		return err
	}
	select {
	case <-n.done:
		return nil
	case <-time.After(60 * time.Second):
		return fmt.Errorf("the private RabbitMQ node %s still runs 60s after rabbitmqctl stop", n.node)
	}
}

// kill SIGKILLs the node's process group (the script and the Erlang VM) and waits for it.
func (n *rabbitNode) kill() {
	if n.cmd == nil {
		return
	}
	_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
	<-n.done
}

// remove kills the node and deletes its directory.
func (n *rabbitNode) remove() {
	n.kill()
	if err := os.RemoveAll(n.dir); err != nil {
		n.log.Warn("removing the private RabbitMQ node failed", slog.String("dir", n.dir), slog.Any("error", err))
	}
}

// removeStaleRabbitNodes kills and removes the nodes of earlier runs that were killed before
// their clean-up (directories starting with rabbitDirPrefix, over an hour old).
func removeStaleRabbitNodes(log *slog.Logger) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), rabbitDirPrefix+"*"))
	for _, dir := range dirs {
		info, err := os.Stat(dir)
		if err != nil || time.Since(info.ModTime()) < time.Hour {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(dir, "pgid")); err == nil {
			// Only a process group whose leader still runs this node's script.
			pgid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			if env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pgid)); pgid > 0 && err == nil && strings.Contains(string(env), "HOME="+dir) {
				_ = syscall.Kill(-pgid, syscall.SIGKILL)
			}
		}
		_ = os.RemoveAll(dir)
		log.Info("removed the private RabbitMQ node of an earlier run", slog.String("dir", dir))
	}
}
