package layers_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/layers"
)

const m = layers.Module + "/"

// TestModuleKeepsTheLayers checks the module's own import graph against Rules. Before the
// layers were split (issue 16), it failed for every channel and dead-letter package, e.g.
//
//	channel/gochannel must not depend on github.com/jackc/pgx/v5 (forbidden: …):
//	channel/gochannel → projection → github.com/jackc/pgx/v5
//
// and for trigger, which held the relay and the appender.
func TestModuleKeepsTheLayers(t *testing.T) {
	t.Parallel()
	g, err := layers.Load("../..")
	require.NoError(t, err)
	if problems := layers.Check(g, layers.Rules); len(problems) > 0 {
		t.Fatalf("the import graph breaks the layers (internal/layers.Rules):\n%s", strings.Join(problems, "\n"))
	}
}

// TestCheck: the checker reports a forbidden dependency reached through another package with
// the chain of imports, a leaf's dependency outside its Allow list, a stdlib-only package's
// third-party import, and a rule whose package does not exist; test files are no part of it.
func TestCheck(t *testing.T) {
	t.Parallel()
	g := layers.Graph{
		m + "name":                {Imports: []string{"fmt"}},
		m + "eventstore":          {Imports: []string{"fmt", m + "name"}},
		m + "trigger":             {Imports: []string{m + "eventstore", m + "internal/bad"}},
		m + "internal/bad":        {Imports: []string{"github.com/google/uuid"}},
		m + "channel/gochannel":   {Imports: []string{m + "trigger", m + "projection"}},
		m + "projection":          {Imports: []string{m + "eventstore", "github.com/jackc/pgx/v5"}},
		m + "channel/amqp":        {Imports: []string{m + "trigger"}},
		m + "channel/postgres":    {Imports: []string{m + "trigger", "github.com/jackc/pgx/v5"}},
		m + "deadletter":          {Imports: []string{m + "eventstore/postgres"}},
		m + "eventstore/postgres": {Imports: []string{"github.com/jackc/pgx/v5"}},
		"github.com/jackc/pgx/v5": {Imports: []string{"fmt"}},
		"github.com/google/uuid":  {Imports: []string{"fmt"}},
		"fmt":                     {Standard: true},
	}
	forbid := []string{"github.com/jackc/pgx/v5/...", m + "projection/...", m + "*/postgres"}
	rules := []layers.Rule{
		{Package: "name", StdlibOnly: true},
		{Package: "eventstore", Leaf: true, Allow: []string{"name"}},
		{Package: "trigger", Leaf: true, Allow: []string{"eventstore", "name"}},
		{Package: "channel/gochannel", Forbid: forbid},
		{Package: "channel/amqp", Forbid: forbid},
		{Package: "deadletter", Forbid: forbid},
		{Package: "channel/nats", Forbid: forbid},
	}
	require.Empty(t, layers.Check(g, rules[:2]), "name and eventstore keep their rules")
	require.Equal(t, []string{
		"trigger must not depend on internal/bad (a leaf; allowed: eventstore, name): trigger → internal/bad",
		"channel/gochannel must not depend on projection (forbidden: projection/...): channel/gochannel → projection",
		"deadletter must not depend on eventstore/postgres (forbidden: */postgres): deadletter → eventstore/postgres",
		"channel/nats: no such package in the graph; update the rule",
	}, layers.Check(g, rules[2:]))

	g[m+"name"] = layers.Package{Imports: []string{"github.com/google/uuid"}}
	require.Equal(t, []string{
		"name must not depend on github.com/google/uuid (standard library only): name → github.com/google/uuid",
	}, layers.Check(g, rules[:1]))
}
