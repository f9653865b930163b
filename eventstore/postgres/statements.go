package postgres

import (
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/pghorizon"
)

// statements are the store's SQL with its table names qualified by the configured schema.
type statements struct {
	lockStream string
	// lockStreamOwn is lockStream for a transaction of the store's own.
	lockStreamOwn string
	exempt        string
	key           string // SQL expression of the store's exemption key
	horizon       string // the readable expression
	eventsByID    string
	insertEvents  string
	// read, readType and readTypes are indexed by ReadOptions.OmitPayload (0: with payloads).
	read       [2]string
	readType   [2]string
	readTypes  [2]string
	readStream string
	head       string
	holder     string
}

const eventColumns = `global_position, transaction_id, event_id, stream_id, stream_version, event_type, payload, metadata, recorded_at`

// bareColumns are eventColumns without the JSON, for ReadOptions.OmitPayload.
const bareColumns = `global_position, transaction_id, event_id, stream_id, stream_version, event_type, NULL::jsonb, NULL::jsonb, recorded_at`

// horizon is the read-order condition that never skips: only events of transactions older
// than every transaction still running that may append events can be read, so nothing can
// commit behind the reader later. {floor} is the statement's parameter of the store's floor
// (Store.floor): a horizon this store saw before, below which nothing can commit any more.
//
// The horizon is never below the statement's snapshot's xmin, the oldest transaction it sees
// running: with no event the snapshot sees at or above xmin, every horizon from xmin up reads
// the same events. Then the statement compares with xmin and leaves {readable}, whose scan of
// the lock table grows with the connections and locks of the whole cluster, unevaluated (an
// init plan runs at its first use, here only in the CASE's branch that needs it). The test
// compares the newest event's transaction with xmin: max() is read from the end of the events'
// (transaction_id, global_position) index, one entry whatever the table's size (an EXISTS with
// the comparison was planned as a scan of the table, which reads it all when nothing is at or
// above xmin). A reader whose events are all older than every running transaction — a
// projection between two appends, a quiet store — so pays no scan.
const horizon = `transaction_id < ` + horizonBound

// horizonBound is horizon's bound: the transaction id below which events are readable.
const horizonBound = `greatest(CASE WHEN coalesce((SELECT max(transaction_id) FROM {events}) >= pg_snapshot_xmin(pg_current_snapshot()), false)
		THEN {readable} ELSE pg_snapshot_xmin(pg_current_snapshot()) END, {floor}::xid8)`

// exemptGuard is the first statement of the exemption's declaration (Store.ExemptTxOptions,
// Store.BeginExemptBatch), after BEGIN: it sets transaction_deferrable to its current value, a
// no-op whose check PostgreSQL makes on every SET of it, and which fails (active_sql_transaction,
// 25001) in a subtransaction or once the transaction has run a query (taken a snapshot). So the
// exemption lock behind it is taken only as the first work of a top-level transaction: not in a
// transaction that may have appended already (a BEGIN sent inside it only draws a warning),
// and not in a savepoint, whose rollback would end the exemption while the transaction keeps its
// id. SET takes no snapshot itself, and a failure aborts the transaction before the lock.
const exemptGuard = `SET LOCAL transaction_deferrable FROM CURRENT`

// exemptHeld is true when the statement's backend holds the store's exemption lock, at
// transaction or session level, however it was taken: readers pass its transaction (see
// internal/pghorizon), so it must not append.
const exemptHeld = `EXISTS (SELECT FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory' AND mode = 'ShareLock'
		AND classid = ` + pghorizon.ExemptClass + `::oid AND objid = {key} AND objsubid = 2
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`

func newStatements(schema string) statements {
	table := func(name string) string {
		if schema == "" {
			return name
		}
		return pgx.Identifier{schema, name}.Sanitize()
	}
	// The key of the store's exemption lock and the horizon (see internal/pghorizon).
	key := pghorizon.Key(schema)
	readableSQL := pghorizon.Readable(schema)
	h := strings.NewReplacer("{readable}", readableSQL, "{events}", table("nudge_events")).Replace(horizon)
	bound := strings.NewReplacer("{readable}", readableSQL, "{events}", table("nudge_events")).Replace(horizonBound)
	r := strings.NewReplacer("{readable}", readableSQL, "{bound}", bound, "{heldLimit}", strconv.Itoa(eventstore.HeldEventsLimit), "{events}", table("nudge_events"), "{streams}", table("nudge_streams"), "{columns}", eventColumns, "{horizon}", h,
		"{key}", key, "{exemptHeld}", strings.ReplaceAll(exemptHeld, "{key}", key))
	bare := strings.NewReplacer("{events}", table("nudge_events"), "{columns}", bareColumns, "{horizon}", h, "{bound}", bound)
	// The floor is the read statements' last parameter.
	floor := func(sql, param string) string { return strings.ReplaceAll(sql, "{floor}", param) }
	return statements{
		key:     key,
		horizon: readableSQL,
		// The last statement of an exempt transaction's declaration (Store.ExemptTxOptions),
		// after exemptGuard: the exemption lock.
		exempt: r.Replace(`SELECT pg_advisory_xact_lock_shared(` + pghorizon.ExemptClass + `, ({key})::int4)`),
		// The row lock serialises appenders of one stream; FOR UPDATE re-reads the newest
		// committed row after waiting, so the version seen is current. The statement returns
		// one row, the stream's columns NULL when it does not exist yet, and says whether the
		// transaction is exempt from the horizon (exemptHeld), where it must not append.
		lockStream: r.Replace(strings.ReplaceAll(lockStreamSQL, "{exempt}", "{exemptHeld}")),
		// lockStream in a transaction the store began in the same round trip (Append): it
		// cannot hold the exemption lock at transaction level, and the pg_locks scan costs
		// 30–50 µs of the server's time on an idle lock table, ten times that when busy.
		lockStreamOwn: r.Replace(strings.ReplaceAll(lockStreamSQL, "{exempt}", "false")),
		eventsByID: r.Replace(`SELECT {columns} FROM {events} WHERE event_id = ANY($1::uuid[])
			ORDER BY stream_id, stream_version`),
		// Rows are inserted in stream order, so global positions rise with the version.
		insertEvents: r.Replace(`WITH ins AS (
				INSERT INTO {events} (event_id, stream_id, stream_version, event_type, payload, metadata)
				SELECT e.id, $1, $2::bigint + e.ord, e.type, e.payload::jsonb, e.metadata::jsonb
				FROM unnest($3::uuid[], $4::text[], $5::text[], $6::text[]) WITH ORDINALITY AS e(id, type, payload, metadata, ord)
				ORDER BY e.ord
				RETURNING global_position, transaction_id, recorded_at, stream_version
			), stream AS (
				INSERT INTO {streams} (stream_id, version, last_transaction_id)
				VALUES ($1, $2::bigint + cardinality($3::uuid[]), pg_current_xact_id())
				ON CONFLICT (stream_id) DO UPDATE SET version = EXCLUDED.version,
					last_transaction_id = EXCLUDED.last_transaction_id, updated_at = EXCLUDED.updated_at
			)
			SELECT global_position, transaction_id, recorded_at FROM ins ORDER BY stream_version`),
		read:      [2]string{floor(r.Replace(readSQL), "$4"), floor(bare.Replace(readSQL), "$4")},
		readType:  [2]string{floor(r.Replace(readTypeSQL), "$5"), floor(bare.Replace(readTypeSQL), "$5")},
		readTypes: [2]string{floor(r.Replace(readTypesSQL), "$5"), floor(bare.Replace(readTypesSQL), "$5")},
		readStream: r.Replace(`SELECT {columns} FROM {events}
			WHERE stream_id = $1 AND stream_version > $2 ORDER BY stream_version LIMIT $3`),
		// The transaction at the horizon, if committed events wait behind it, with what
		// pg_stat_activity (or pg_prepared_xacts) tells of it. Parallel workers share their
		// leader's id: the leader's row comes first.
		holder: r.Replace(`WITH h AS MATERIALIZED (SELECT {readable} AS xmin),
			held AS MATERIALIZED (
				SELECT count(*) AS n FROM (SELECT 1 FROM {events} e WHERE e.transaction_id >= (SELECT xmin FROM h) LIMIT {heldLimit} + 1) c
			)
			SELECT h.xmin, held.n, age(h.xmin::xid), a.pid, coalesce(a.datname, p.database::text, ''), coalesce(a.usename::text, p.owner::text, ''),
				coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''), coalesce(a.xact_start, p.prepared),
				coalesce(a.state, ''), coalesce(a.wait_event_type || ':' || a.wait_event, ''), coalesce(p.gid, ''),
				CASE WHEN a.datname = current_database() THEN EXISTS (SELECT 1 FROM pg_locks l
					WHERE l.pid = a.pid AND l.locktype = 'relation' AND l.relation = {key} AND l.mode = 'RowExclusiveLock' AND l.granted
						AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())) END,
				pg_has_role('pg_read_all_stats', 'USAGE'), current_user::text
			FROM h CROSS JOIN held
				LEFT JOIN LATERAL (SELECT * FROM pg_stat_activity a WHERE a.backend_xid = h.xmin::xid
					ORDER BY a.leader_pid IS NULL OR a.leader_pid = a.pid DESC LIMIT 1) a ON true
				LEFT JOIN pg_prepared_xacts p ON p.transaction = h.xmin::xid
			WHERE held.n > 0`),
		head: floor(r.Replace(`SELECT transaction_id, global_position FROM {events} WHERE {horizon}
			ORDER BY transaction_id DESC, global_position DESC LIMIT 1`), "$1"),
	}
}

// lockStreamSQL is lockStream's statement, {exempt} the column that says whether the
// transaction is exempt.
const lockStreamSQL = `SELECT {exempt}, s.version, s.last_transaction_id, pg_current_xact_id()
	FROM (SELECT) x LEFT JOIN LATERAL (
		SELECT version, last_transaction_id FROM {streams} WHERE stream_id = $1 FOR UPDATE
	) s ON true`

const readSQL = `SELECT {columns} FROM {events}
	WHERE (transaction_id, global_position) > ($1::xid8, $2::bigint) AND {horizon}
	ORDER BY transaction_id, global_position LIMIT $3`

// readTypeSQL reads the events of one type ($4) through the type index (event_type,
// transaction_id, global_position), from the position to the horizon in read order, bounded by
// the limit: the index's own key bounded from both sides (that type and the position above,
// that type and the horizon below), which no other index can serve and no sort can replace
// without fetching every event of the type after the position. A read so fetches the events it
// returns, whatever the backlog, the type's share of the log or the table's statistics.
//
// readTypesSQL reads the events of several types ($4): it runs with sorting off (sortOff),
// which leaves the walk of the read-order index past the other types' events, the log read
// once by a catch-up. Left to its estimates, with statistics that lag a growing table or types
// rare in the log, the planner fetched every event of the types after the position through
// the type index and sorted them (one condition event_type = ANY($4) cannot be read in read
// order there), and each batch of a catch-up read the rest of its backlog (5 ms for a batch of
// one event with 21,000 events left). Branches per type through the type index cost 1.4–2× the
// walk when the types make up most of the log, each batch reading up to its limit of each type.
const (
	readTypeSQL = `SELECT {columns} FROM {events}
	WHERE (event_type, transaction_id, global_position) > ($4::text, $1::xid8, $2::bigint) AND (event_type, transaction_id) < ($4::text, {bound})
	ORDER BY event_type, transaction_id, global_position LIMIT $3`
	readTypesSQL = `SELECT {columns} FROM {events}
	WHERE (transaction_id, global_position) > ($1::xid8, $2::bigint) AND {horizon}
		AND event_type = ANY($4::text[])
	ORDER BY transaction_id, global_position LIMIT $3`
)
