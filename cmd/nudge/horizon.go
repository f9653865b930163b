package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
)

const horizonDoc = `Shows the open transaction that holds the event store's readers back, if committed events
wait behind it: readers never skip an event of a transaction that may still commit, so every
projection waits until that transaction ends. It names the session in any database of the
cluster: pid, database, user, application, client address, when the transaction began and its
age, its state and what it waits on, whether it has written events here, and how many
committed events it holds back. End the wait by ending that transaction (COMMIT or ROLLBACK in
its session, or SELECT pg_terminate_backend(pid)).

Without the privilege to see other users' sessions (pg_read_all_stats) it shows the
transaction id and says so. Exit status 0 whether or not something holds the horizon.

--json prints the holder as an object (the fields of 'nudge status --json''s holder), or null.
`

func (c *cli) horizon(ctx context.Context, args []string) error {
	cmd := command{name: "horizon", synopsis: "[--json]", doc: horizonDoc}
	fs := newFlagSet(cmd.name)
	asJSON := fs.Bool("json", false, "print a JSON object (null when nothing holds the horizon)")
	rest, err := c.parse(fs, cmd, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usageErrorf("horizon takes no arguments, got %q", rest)
	}
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := espg.New(pool, espg.Config{Schema: c.g.schema})
	if err != nil {
		return usageErrorf("--schema: %v", err)
	}
	h, err := store.HorizonHolder(ctx)
	if err != nil {
		if isUndefinedTable(err) {
			return fmt.Errorf("no event store here (nudge_events is missing): run 'nudge migrate' or check --schema and the database")
		}
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(toHolderJSON(h))
	}
	return writeHolder(c.stdout, h)
}

// writeHolder prints h as label/value lines. Text from the server (application names, user
// names) is made terminal-safe.
func writeHolder(w io.Writer, h *eventstore.HorizonHolder) error {
	if h == nil {
		_, err := fmt.Fprintln(w, "Nothing holds the horizon: every committed event is readable.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	line := func(label, value string) { fmt.Fprintf(tw, "%s\t%s\n", label, terminalSafe(value)) }
	held := strconv.FormatInt(h.HeldEvents, 10)
	if h.HeldEventsMore {
		held += " or more"
	}
	line("transaction", strconv.FormatUint(h.TransactionID, 10))
	line("holds back", held+" committed events")
	line("ids since", strconv.FormatInt(h.TransactionsSince, 10)+" transactions began after it")
	if h.Hidden != "" {
		line("session", h.Hidden)
		return tw.Flush()
	}
	if h.PreparedGID != "" {
		line("prepared", h.PreparedGID+" (COMMIT PREPARED or ROLLBACK PREPARED ends it)")
	} else {
		line("pid", strconv.Itoa(h.PID))
	}
	line("database", h.Database)
	line("user", h.User)
	if h.ApplicationName != "" {
		line("application", h.ApplicationName)
	}
	if h.ClientAddr != "" {
		line("client", h.ClientAddr)
	}
	if !h.Started.IsZero() {
		line("began", h.Started.UTC().Format(time.RFC3339Nano))
		line("open for", humanDuration(h.Age))
	}
	if h.State != "" {
		line("state", h.State)
	}
	if h.WaitEvent != "" {
		line("waiting on", h.WaitEvent)
	}
	if h.WritesEventsKnown {
		line("written events", strconv.FormatBool(h.WritesEvents))
	} else {
		line("written events", "unknown (another database)")
	}
	return tw.Flush()
}
