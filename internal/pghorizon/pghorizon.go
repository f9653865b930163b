// Package pghorizon holds the SQL of the event store's horizon: the oldest transaction whose
// events may not all be readable yet. The store (eventstore/postgres) reads below it, and the
// driver core (package postgres) embeds it in the view nudge_projection_conditions, so both
// take it from here.
//
// The horizon counts only transactions that may append to the store's events, so never one of
// another database of the cluster (a backend never changes database): a batch job or a report
// elsewhere holds no reader back. Such a transaction is recognised in the same scan of the lock
// table as the exempt ones: under its virtual transaction it holds a lock of its database (a
// relation, an advisory lock; prepared transactions keep theirs) and none of the store's. A
// backend of database X holds locks of X, of the shared catalogs (database 0) and locks of
// no database (transaction ids); the one exception, CREATE DATABASE, also locks relations of
// the template and of the new database, but runs alone in its transaction and appends nothing.
// A transaction of another database that has taken an id but holds no lock of that database
// (only SELECT pg_current_xact_id(), or only shared catalogs) still holds readers back, and so
// does every transaction in its commit window (see readable).
package pghorizon

import (
	"strings"

	"github.com/jackc/pgx/v5"
)

// Key is the SQL expression of the key of the store's exemption lock in schema ("" for the
// search path): the events table's OID, resolved when a statement is planned, so "" and
// "public" over one table share it. schema must be a valid schema name (postgres.ValidateSchema).
func Key(schema string) string {
	table := "nudge_events"
	if schema != "" {
		table = pgx.Identifier{schema, table}.Sanitize()
	}
	return "'" + table + "'::regclass::oid"
}

// Readable is the SQL expression of type xid8 (a scalar subquery) of the horizon of the store in
// schema; see readable.
func Readable(schema string) string {
	return strings.ReplaceAll(readable, "{key}", Key(schema))
}

// readable is the oldest transaction id whose events may not all be readable yet: the oldest
// running transaction of the statement's snapshot that is not exempt from the horizon (see
// eventstore/postgres's Store.ExemptTxOptions), else the next id to be assigned — or the
// reader's own id, if it has one. pg_locks is read only while some transaction runs (the ARRAY
// is an init plan, evaluated at its first use).
//
// Leaving an exempt transaction out is safe because it appends nothing: it was exempted by its
// BEGIN, before it could write, at the top level, where no rollback to a savepoint can end the
// exemption; the store's AppendTx refuses to append in it. What must never happen is taking a
// transaction that may append for exempt. exemptXids finds the exempt ones in pg_locks: every transaction
// holds an ExclusiveLock on its own id (a lock it waits for on another's id is a ShareLock),
// and an exempt one also holds the shared advisory lock (ExemptClass, the events table's OID);
// the two are tied by virtualtransaction; a transaction of another database is tied the same
// way to a lock of its database. Two rules keep that tie exact:
//
//   - One snapshot of the lock table. pg_locks is a call of pg_lock_status(), each call a
//     snapshot of its own; the locks are grouped in one scan, never joined across two. Two
//     scans taken moments apart could pair the id lock of one transaction with the advisory
//     lock of the next transaction of the same backend.
//   - Never a finished virtual transaction. While a backend commits, between leaving the proc
//     array and releasing its locks, its locks are listed under "<backend>/0", a name every
//     transaction of that backend has in turn. Such locks are counted as not exempt: the
//     transaction then holds readers back for a moment longer, never less.
//
// Within one snapshot a live virtual transaction names one transaction: a backend releases all
// its transaction locks before it starts the next transaction (session-level advisory locks
// are the exception; a session holding this class and key itself declares every transaction it
// runs exempt). A scan reads the fast-path locks backend by backend before the shared lock
// table, yet no two transactions share a live name: a new backend that takes a backend id goes
// on with the local transaction counter its predecessor left (PostgreSQL keeps it per backend
// slot: sinval's nextLXID), and prepared transactions are named "-1/<xid>". And the statement's
// snapshot comes before the scan: a transaction of the snapshot that still holds its id lock at
// the scan has held its backend since before it, so no backend that took its place later can
// lend it its database. eventstore/postgres's TestHorizonCommitWindow and
// TestHorizonOtherDatabaseSlotReuse force those interleavings with gdb.
const readable = `(SELECT least(coalesce((SELECT min(x) FROM pg_snapshot_xip(s) x
			WHERE x::xid <> ALL (ARRAY(` + exemptXids + `))),
		pg_snapshot_xmax(s)), pg_current_xact_id_if_assigned())
	FROM pg_current_snapshot() s)`

// exemptXids lists the transaction ids (top level and subtransactions) of the transactions
// that are exempt from the horizon, from one scan of the lock table; see readable. A
// transaction is exempt when it holds the store's exemption lock, or when it runs in another
// database: it holds a lock of another database (not 0, the shared catalogs) and none of this
// one. Locks with no database (ids, virtual ids) say nothing either way.
//
// So only two kinds of rows can change the answer, and only they are grouped: the id locks,
// whose ids are listed, and the locks of a database (not 0), which decide whether a virtual
// transaction is exempt. The rest — a virtual id lock for every transaction running, the
// locks of the shared catalogs — is dropped before the grouping: each would only add false (or
// null) to the group's bool_or terms, or make a group of its own with no id to list.
const exemptXids = `SELECT unnest(array_agg(transactionid) FILTER (WHERE locktype = 'transactionid' AND mode = 'ExclusiveLock'))
	FROM pg_locks, (SELECT oid AS here FROM pg_database WHERE datname = current_database()) d
	WHERE granted AND virtualtransaction NOT LIKE '%/0'
		AND (locktype = 'transactionid' AND mode = 'ExclusiveLock' OR database <> 0)
	GROUP BY virtualtransaction, here
	HAVING bool_or(locktype = 'advisory' AND mode = 'ShareLock' AND classid = ` + ExemptClass + `::oid AND objid = {key} AND objsubid = 2
			AND database = here)
		OR (bool_or(database <> 0 AND database <> here) AND NOT coalesce(bool_or(database = here), false))`

// ExemptClass is the first key of the advisory lock that exempts a transaction from the
// horizon ("nhzn" in ASCII); the second is {key}, the events table's OID, so that every store
// over one table — whatever schema string named it — shares one exemption.
const ExemptClass = "1852340846"
