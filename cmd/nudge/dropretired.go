package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nudgeworks/nudge/name"
	"github.com/nudgeworks/nudge/projection"
)

const dropRetiredDoc = `Drops the read model of a retired version of a projection now, instead of after its
RetireGrace: PROJECTION is the retired version's name as 'nudge status' lists it (ticket_list
for version 1, ticket_list.v2 for version 2). A version that is not retired is refused: the
active version and one being built are never dropped.

The command has no projection definitions, so it does what a runner does for a retired version
whose code is gone: under the version's lock it drops the versioned table (<name>_v<N>) of
every stable name recorded for the version (projection.Config.Tables, or the table a newer
version adopted from a version 1) and records the drop, after which no worker runs the
version's DeleteFunc. Whatever else that DeleteFunc would remove is left: let the grace pass
instead where it does more. The version's status row stays; a drop already done is not an
error. Exit status 0 when the version's read model is gone.
`

func (c *cli) dropRetired(ctx context.Context, args []string) error {
	cmd := command{name: "drop-retired", synopsis: "PROJECTION", doc: dropRetiredDoc}
	fs := newFlagSet(cmd.name)
	pos, err := c.parse(fs, cmd, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErrorf("drop-retired takes one PROJECTION: the retired version's name as 'nudge status' lists it, got %d arguments", len(pos))
	}
	unit := pos[0]
	if err := name.Validate(unit); err != nil {
		return usageErrorf("drop-retired: %v", err)
	}
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	backend, err := c.projectionBackend(pool)
	if err != nil {
		return err
	}
	st, err := backend.StatusOf(ctx, unit)
	if err != nil {
		if errors.Is(err, projection.ErrNotRegistered) {
			return fmt.Errorf("no projection named %s in this database (no status row in nudge_projections); check the name and --schema", unit)
		}
		return fmt.Errorf("read the status of projection %s: %w", unit, err)
	}
	if st.VersionState != projection.VersionRetired {
		state := string(st.VersionState)
		if state == "" {
			state = "not versioned"
		}
		return fmt.Errorf("projection %s (version %d) is %s, not retired: %w",
			unit, st.Version, state, projection.ErrNotRetired)
	}
	base := strings.TrimSuffix(unit, ".v"+strconv.Itoa(st.Version))
	// A stand-in definition of the retired version, without hooks: its runner drops the
	// recorded tables, as for a version whose code is gone. It is not registered (Init would
	// record its empty table list).
	runner, err := standInRunner(backend, base, nil, st.Version)
	if err != nil {
		return err
	}
	if err := runner.DropRetired(ctx, unit); err != nil {
		return err
	}
	retired := ""
	if !st.RetiredAt.IsZero() {
		retired = " (retired at " + st.RetiredAt.UTC().Format(time.RFC3339) + ")"
	}
	fmt.Fprintf(c.stdout, "dropped the read model of %s, version %d of %s%s\n", unit, st.Version, base, retired)
	return nil
}
