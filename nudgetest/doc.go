// Package nudgetest helps a service test its projections on PostgreSQL, without a broker,
// as rivertest does for River's jobs.
//
// Database gives each test a database of its own with nudge's tables (and the service's own,
// through Options.MigrateFunc) already in it: a copy of a template database that the test
// process migrates once, so a test pays for a copy (tens of milliseconds), not for the
// migrations. New builds a Kit on it for the service's projections; the kit appends events,
// catches the projections up to the head (RunToHead) and asserts on the read model
// (RequireRows), a projection's condition and failure (RequireCondition, RequireFailure), its
// parked streams (RequireParked) and dead letters (RequireDeadLetters). A failed assertion
// says what it wanted and what it found. NewInMemory is the kit on nudge's in-memory store,
// for read models outside PostgreSQL; it needs no server.
//
//	func TestTicketList(t *testing.T) {
//		t.Parallel()
//		db := nudgetest.Database(t, nudgetest.Options{})
//		kit := nudgetest.New(t, db, nudge.Config{Projections: []*projection.Projection{ticketList(t)}})
//		kit.Append(t, "ticket-1", nudgetest.Event(t, "TicketWasRegistered", registered{ID: "1", Title: "Printer"}))
//		kit.RunToHead(t)
//		kit.RequireRows(t, []nudgetest.Row{{"id": "1", "title": "Printer"}}, `SELECT id, title FROM tickets ORDER BY id`)
//	}
//
// The server comes from Options.URL, else NUDGE_TEST_DATABASE_URL, NUDGE_TEST_POSTGRES_URL or
// DATABASE_URL, else URLDefault (127.0.0.1). An unreachable server skips the test, or fails
// it when CI=true. The guide is docs/guides/testing.md.
package nudgetest
