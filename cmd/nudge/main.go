// Command nudge is the operator's tool for a nudge deployment: it shows the projections' status
// and lag (once, or redrawn with --watch, or as JSON), rebuilds a projection through its worker
// and follows the rebuild's progress, pauses and resumes a projection, lists, inspects,
// replays, resolves and purges dead letters, skips an event a projection cannot handle, and
// creates or upgrades the tables of the event store, the projections and the dead letters.
//
// It needs no projection definitions: status reads everything from the database (the event
// types each projection handles are recorded there when its worker starts), and the commands
// that need a definition's hooks (rebuild, skip) send their request as a trigger to the
// projection's worker.
//
// Global flags (--db, --amqp, --amqp-prefix, --channel, --schema) may be given before the
// command or after it, between the command's own flags. Run `nudge help` for the commands.
//
// Exit codes: 0 success, 1 the command failed (database or broker unreachable, unknown
// projection or id, refused skip, a rebuild that failed or timed out, …), 2 the command line is
// wrong, 130 interrupted by Ctrl-C (SIGINT), 143 stopped by SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/nudgeworks/nudge/postgres"
)

// Environment variables the global flags default to.
const (
	envDatabaseURL = "NUDGE_DATABASE_URL"
	envAMQPURL     = "NUDGE_AMQP_URL"
	envAMQPPrefix  = "NUDGE_AMQP_PREFIX"
	envSchema      = "NUDGE_SCHEMA"
)

// Channel names for --channel.
const (
	channelAMQP     = "amqp"
	channelPostgres = "postgres"
)

func main() {
	ctx, stop := notifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// signalError is the cause of a context that a signal ended.
type signalError struct{ sig os.Signal }

func (e *signalError) Error() string { return e.name() + " received" }

// name is the signal's name, e.g. SIGINT.
func (e *signalError) name() string {
	switch e.sig {
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return e.sig.String()
}

// exitCode is the shell's code for a process ended by the signal: 128 plus its number.
func (e *signalError) exitCode() int {
	if n, ok := e.sig.(syscall.Signal); ok {
		return 128 + int(n)
	}
	return 128 + int(syscall.SIGINT)
}

// notifyContext returns a context that the first of sigs cancels, with a *signalError as its
// cause (context.Cause), so that run can exit with the signal's code. A second signal gets its
// default action: Ctrl-C twice kills a command that does not stop.
func notifyContext(parent context.Context, sigs ...os.Signal) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(parent)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sigs...)
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-ch:
			signal.Stop(ch)
			cancel(&signalError{sig: sig})
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		close(done)
		cancel(nil)
	}
}

const mainUsage = `nudge — operate a nudge deployment.

Usage:
  nudge [global flags] <command> [arguments and flags]

Commands:
  status             [PROJECTION...] [--json] [--watch] [--interval 2s]
  horizon            [--json]   the open transaction that holds every reader back, if any
  rebuild            PROJECTION [--no-wait] [--by NAME] [--timeout 1h]   (alias: reset)
  deadletter list    [--projection P] [--status failed|replayed|resolved] [--limit N] [--json]
  deadletter show    ID [--json]
  deadletter replay  (ID... | --projection P | --all) [--by NAME]
  deadletter resolve ID [--by NAME] [--note TEXT]
  deadletter purge   [--older-than 720h] [--include-unresolved]
  skip               PROJECTION --event EVENT_UUID --reason TEXT [--by NAME] [--force] [--direct]
  parked list        [PROJECTION] [--json]   streams parked by projections with OnFailure park
  parked show        PROJECTION STREAM [--json]
  parked redrive     (PROJECTION [--stream S] | --all) [--by NAME] [--wait 30s]
  parked skip        PROJECTION --stream S --reason TEXT [--by NAME]
  parked purge       (PROJECTION | --all) --reason TEXT [--by NAME]
  pause              PROJECTION [--by NAME]   stop its batches in every process until resume
  resume             PROJECTION [--by NAME]   let a paused projection catch up again
  drop-retired       PROJECTION   drop a retired version's read model now (not after RetireGrace)
  console            [--listen 127.0.0.1:8080] [--writes]   the operator console in a browser
  migrate            create or upgrade the event store, projection and dead-letter tables
                     (the PostgreSQL channel's tables are its workers' to create)
  version            the version of nudge and of the Go it was built with (also --version)
  help [command]     show this text, or a command's

Global flags (before or after the command):
  --db URL           PostgreSQL URL; defaults to $NUDGE_DATABASE_URL
  --schema NAME      schema of nudge's tables; defaults to $NUDGE_SCHEMA, else the search_path
  --amqp URL         RabbitMQ URL, for replay, skip and rebuild; defaults to $NUDGE_AMQP_URL
  --amqp-prefix P    prefix of the channel's exchanges and queues; defaults to $NUDGE_AMQP_PREFIX
  --channel NAME     channel replay, skip and rebuild publish to: amqp or postgres; amqp
                     when an AMQP URL is set, else postgres

Run 'nudge <command> --help' for a command's flags.
Exit codes: 0 success, 1 the command failed, 2 the command line is wrong, 130 interrupted
(Ctrl-C), 143 stopped (SIGTERM).
`

// globals holds the global flags.
type globals struct {
	db, schema, amqp, amqpPrefix, channel string
}

// register adds the global flags to fs, bound to the fields of g. Their defaults are empty, so
// usage never shows a URL (with its password) from the environment.
func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.db, "db", "", "PostgreSQL `URL` (default $"+envDatabaseURL+")")
	fs.StringVar(&g.schema, "schema", "", "`schema` of nudge's tables (default $"+envSchema+", else the search_path)")
	fs.StringVar(&g.amqp, "amqp", "", "RabbitMQ `URL` (default $"+envAMQPURL+")")
	fs.StringVar(&g.amqpPrefix, "amqp-prefix", "", "`prefix` of the AMQP channel's exchanges and queues (default $"+envAMQPPrefix+")")
	fs.StringVar(&g.channel, "channel", "", "`NAME` of the channel replay, skip and rebuild publish to: amqp or postgres (default amqp when an AMQP URL is set, else postgres)")
}

// merge copies into g the global flags that were set on fs (bound to from).
func (g *globals) merge(fs *flag.FlagSet, from *globals) {
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "db":
			g.db = from.db
		case "schema":
			g.schema = from.schema
		case "amqp":
			g.amqp = from.amqp
		case "amqp-prefix":
			g.amqpPrefix = from.amqpPrefix
		case "channel":
			g.channel = from.channel
		}
	})
}

// resolve fills unset globals from the environment and checks --channel.
func (g *globals) resolve(env func(string) string) error {
	if g.db == "" {
		g.db = env(envDatabaseURL)
	}
	if g.schema == "" {
		g.schema = env(envSchema)
	}
	if g.amqp == "" {
		g.amqp = env(envAMQPURL)
	}
	if g.amqpPrefix == "" {
		g.amqpPrefix = env(envAMQPPrefix)
	}
	if postgres.ValidateSchema(g.schema) != nil {
		return usageErrorf("--schema %q is not a schema name nudge uses: use lowercase letters, digits and _ "+
			"(at most 63, not starting with a digit)", g.schema)
	}
	switch g.channel {
	case "":
		g.channel = channelPostgres
		if g.amqp != "" {
			g.channel = channelAMQP
		}
	case channelAMQP, channelPostgres:
	default:
		return usageErrorf("--channel %q: use amqp or postgres", g.channel)
	}
	return nil
}

// cli is one invocation: its output streams, environment and global flags.
type cli struct {
	stdout, stderr io.Writer
	env            func(string) string
	g              globals
}

// usageError is a wrong command line: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// errHelp ends a command that printed its usage on request: exit code 0.
var errHelp = errors.New("help requested")

// run runs the command line args (without the program name) and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, env func(string) string) int {
	if env == nil {
		env = func(string) string { return "" }
	}
	c := &cli{stdout: stdout, stderr: stderr, env: env}
	err := c.dispatch(ctx, args)
	var (
		uerr *usageError
		sig  *signalError
	)
	if errors.As(context.Cause(ctx), &sig) {
		// Interrupted: whatever the command was doing, the shell learns it was a signal.
		switch {
		case err == nil, errors.Is(err, errHelp):
		case errors.Is(err, context.Canceled):
			fmt.Fprintf(stderr, "nudge: stopped by %s: %s\n", sig.name(), terminalSafeLines(err.Error()))
		default:
			fmt.Fprintf(stderr, "nudge: %s\n", terminalSafeLines(err.Error()))
		}
		return sig.exitCode()
	}
	switch {
	case err == nil, errors.Is(err, errHelp):
		return 0
	case errors.As(err, &uerr):
		fmt.Fprintf(stderr, "nudge: %s\nRun 'nudge help' for usage.\n", terminalSafeLines(uerr.msg))
		return 2
	default:
		fmt.Fprintf(stderr, "nudge: %s\n", terminalSafeLines(err.Error()))
		return 1
	}
}

func (c *cli) dispatch(ctx context.Context, args []string) error {
	fs := newFlagSet("nudge")
	var set globals
	set.register(fs)
	showVersion := fs.Bool("version", false, "print the version")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(c.stdout, mainUsage)
			return errHelp
		}
		return usageErrorf("%s", flagError(fs, err))
	}
	c.g.merge(fs, &set)
	rest := fs.Args()
	if *showVersion {
		return c.version(rest)
	}
	if len(rest) == 0 {
		fmt.Fprint(c.stderr, mainUsage)
		return usageErrorf("no command given")
	}
	cmd, rest := rest[0], rest[1:]
	switch cmd {
	case "help", "-h", "--help":
		return c.help(ctx, rest)
	case "status":
		return c.status(ctx, rest)
	case "horizon":
		return c.horizon(ctx, rest)
	case "rebuild", "reset":
		return c.rebuild(ctx, cmd, rest)
	case "deadletter":
		return c.deadletter(ctx, rest)
	case "skip":
		return c.skip(ctx, rest)
	case "parked":
		return c.parked(ctx, rest)
	case "pause", "resume":
		return c.pause(ctx, rest, cmd == "pause")
	case "drop-retired":
		return c.dropRetired(ctx, rest)
	case "console":
		return c.console(ctx, rest)
	case "migrate":
		return c.migrate(ctx, rest)
	case "version":
		return c.version(rest)
	default:
		return unknownCommand(cmd)
	}
}

// commands are the command names, for suggestions.
var commands = []string{"status", "horizon", "rebuild", "reset", "deadletter", "skip", "parked", "pause", "resume", "drop-retired", "console", "migrate", "version", "help"}

// unknownCommand is the error about an unknown command.
func unknownCommand(cmd string) error {
	return usageErrorf("unknown command %q%s; the commands are status, horizon, rebuild (or reset), deadletter, skip, parked, pause, resume, drop-retired, console, migrate, version and help",
		cmd, didYouMean(cmd, commands))
}

func (c *cli) help(ctx context.Context, args []string) error {
	switch strings.Join(args, " ") {
	case "":
		fmt.Fprint(c.stdout, mainUsage)
		return nil
	case "deadletter":
		fmt.Fprint(c.stdout, deadletterUsage)
		return nil
	case "parked":
		fmt.Fprint(c.stdout, parkedUsage)
		return nil
	}
	// Reuse the command's own --help.
	switch args[0] {
	case "status", "horizon", "rebuild", "reset", "deadletter", "skip", "parked", "pause", "resume", "drop-retired", "console", "migrate", "version":
		return c.dispatch(ctx, append(args, "--help"))
	}
	return unknownCommand(args[0])
}

func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // run reports parse errors itself
	fs.Usage = func() {}
	return fs
}

// command describes a subcommand for parse.
type command struct {
	name     string // e.g. "deadletter list"
	synopsis string // arguments, after the name
	doc      string // a paragraph or two
}

// parse parses a subcommand's args with fs, whose own flags are registered already: it adds
// the global flags, allows flags after positional arguments, merges the global flags into
// c.g and resolves them. It returns the positional arguments. --help prints the command's usage
// to stdout and returns errHelp.
func (c *cli) parse(fs *flag.FlagSet, cmd command, args []string) ([]string, error) {
	var set globals
	set.register(fs)
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				printUsage(c.stdout, fs, cmd)
				return nil, errHelp
			}
			return nil, usageErrorf("%s: %s; run 'nudge %s --help' for its flags", cmd.name, flagError(fs, err), cmd.name)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if rest[0] == "--" {
			positional = append(positional, rest[1:]...)
			break
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
	c.g.merge(fs, &set)
	if err := c.g.resolve(c.env); err != nil {
		return nil, err
	}
	return positional, nil
}

func printUsage(w io.Writer, fs *flag.FlagSet, cmd command) {
	fmt.Fprintf(w, "Usage: %s\n\n%s", strings.TrimSpace("nudge "+cmd.name+" "+cmd.synopsis), cmd.doc)
	if len(flagNames(fs)) > 0 {
		fmt.Fprint(w, "\nFlags:\n")
		printFlags(w, fs)
	}
}
