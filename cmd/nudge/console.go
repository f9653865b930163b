package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/nudgeworks/nudge/console"
)

const consoleDoc = `Serves the operator console, the pages of the console package, from the command's
connection settings (--db, --schema, and --channel, --amqp for the actions): an overview of
every projection, a page per projection and per dead letter, refreshed live.

It only reads unless --writes is given: then its pages offer replay, resolve, redrive, skip
(the event's id typed back), rebuild, pause and resume, each a POST with a CSRF token,
recorded as done by --by, or by the value of the request header --actor-header when a proxy
in front sets it.
It listens on loopback unless --listen names another address: put it behind your own
authentication before you open it to a network (or mount console.New in your own server).
Ctrl-C stops it.
`

// shutdownTimeout bounds how long the console waits for requests in flight when it stops.
const shutdownTimeout = 5 * time.Second

func (c *cli) console(ctx context.Context, args []string) error {
	cmd := command{name: "console", synopsis: "[--listen 127.0.0.1:8080] [--writes] [--by NAME] [--actor-header H] [--base-path /console]", doc: consoleDoc}
	fs := newFlagSet(cmd.name)
	listen := fs.String("listen", "127.0.0.1:8080", "`address` to serve on")
	writes := fs.Bool("writes", false, "enable the actions (replay, resolve, redrive, skip, rebuild, pause, resume)")
	by := fs.String("by", "", "who acts, a `NAME` recorded with every action (default $USER)")
	actorHeader := fs.String("actor-header", "", "request `header` naming who acts, set by a proxy in front")
	base := fs.String("base-path", "", "`path` to serve under, e.g. /console")
	pos, err := c.parse(fs, cmd, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("console takes no arguments, got %q", strings.Join(pos, " "))
	}
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg := console.Config{DB: pool, Schema: c.g.schema, Writes: *writes, ActorHeader: *actorHeader, BasePath: *base,
		Actor: strings.Replace(c.actor(*by), "(nudge cli)", "(nudge console)", 1), Logger: slog.New(slog.NewTextHandler(c.stderr, nil))}
	if *writes {
		pub, closePub, err := c.publisher(ctx, pool)
		if err != nil {
			return err
		}
		defer closePub()
		cfg.Channel = pub
	}
	h, err := console.New(cfg)
	if err != nil {
		return usageErrorf("%v", err)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *listen, err)
	}
	mode := "read-only; --writes enables the actions"
	if *writes {
		mode = "actions enabled"
	}
	fmt.Fprintf(c.stdout, "nudge console on http://%s%s/ (%s); Ctrl-C stops it\n", ln.Addr(), strings.TrimRight(*base, "/"), mode)
	mux := http.NewServeMux()
	mux.Handle(strings.TrimRight(*base, "/")+"/", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("stop serving: %w", err)
	}
	return nil
}
