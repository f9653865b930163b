package layers

// Patterns the rules forbid.
const (
	pgx = "github.com/jackc/pgx/v5/..."
	// postgresPackages are the PostgreSQL backends (eventstore/postgres, channel/postgres…).
	postgresPackages = Module + "/*/postgres"
	// postgresDriver is a PostgreSQL package at the root of the module.
	postgresDriver = Module + "/postgres/..."
	runner         = Module + "/projection/..."
	relay          = Module + "/relay"
	worker         = Module + "/worker/..."
)

// noRunnerNoPgx is what the channels, the dead-letter store and the retry policy must not
// reach: a broker or a dead-letter backend that is not PostgreSQL's needs no database driver,
// and none of them needs the projection runner, the relay or the worker.
var noRunnerNoPgx = []string{pgx, postgresPackages, postgresDriver, runner, relay, worker}

// Rules is the allowed import graph, from the bottom up (paths inside the module):
//
//	name, eventstore                  leaves: the vocabulary every layer shares
//	trigger                           the wire format: eventstore and name only
//	channel, deadletter, retry (and   trigger, name, eventstore, Watermill; no runner, no pgx
//	  their non-PostgreSQL backends)
//	postgres                          the PostgreSQL driver core (DB, schema, migrations): no
//	                                    component, runner, broker, relay or worker
//	projection                        the runner: no broker, relay, worker or dead letters
//	worker                            the handlers: no relay, no PostgreSQL backend (the
//	                                    driver core through lease, for partition leases)
//	relay, */postgres, …              may use all of the above
//	nudge (the root)                  the client: everything; nothing in the module imports it
var Rules = []Rule{
	// Leaves.
	{Package: "name", StdlibOnly: true},
	{Package: "eventstore", Leaf: true, Allow: []string{"internal/namecheck"}, Forbid: []string{pgx}},
	{Package: "trigger", Leaf: true, Allow: []string{"eventstore", "name", "internal/namecheck"}, Forbid: []string{pgx}},

	// Channels, dead letters and retries: no runner, no pgx (except their postgres backends).
	{Package: "channel", Forbid: noRunnerNoPgx},
	{Package: "channel/gochannel", Forbid: noRunnerNoPgx},
	{Package: "channel/amqp", Forbid: noRunnerNoPgx},
	{Package: "channel/channeltest", Forbid: noRunnerNoPgx},
	{Package: "deadletter", Forbid: noRunnerNoPgx},
	{Package: "deadletter/memory", Forbid: noRunnerNoPgx},
	{Package: "deadletter/deadlettertest", Forbid: noRunnerNoPgx},
	{Package: "retry", Forbid: noRunnerNoPgx},

	// The driver core knows no component: they are built on it.
	{Package: "postgres", Forbid: []string{postgresPackages, runner, Module + "/channel/...", Module + "/deadletter/...", relay, worker}},

	// The runner knows no broker and nothing built on it.
	{Package: "projection", Forbid: []string{Module + "/channel/...", relay, worker, Module + "/deadletter/...", Module + "/retry"}},

	// The worker runs handlers on any backend: it is given them. It reaches the driver core
	// through package lease alone (the partition leases are rows in PostgreSQL, used only when
	// Config.Leases is set), never a PostgreSQL backend.
	{Package: "worker", Forbid: []string{relay, postgresPackages}},
}
