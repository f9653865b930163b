package postgres

import (
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection"
)

type statements struct {
	// lockAsync is lock for a batch committed asynchronously (batchMode): it also sets
	// synchronous_commit to off for the rest of the transaction, in the same statement.
	lockAsync                                                                                         string
	lock, register, selectStatus, recordFailure, reset, setState, setStateBy, delete, lag, recordSkip string
	// unitsOf names the status rows of a projection by name: its own, or its partitions'.
	unitsOf string
	// lags is lag for many positions and type sets in one statement (Backend.Statuses).
	lags                     string
	startAttempt, endAttempt string
	// advance moves a projection's position on; advanceClearing also clears its failure.
	advance, advanceClearing string
	// advanceClock and advanceClearingClock are the same returning the database's clock, read
	// last in the batch's transaction (projection.Outcome.CommitClock).
	advanceClock, advanceClearingClock string
	// Parked streams: see park.go.
	selectParked, insertParked, addHeld, deleteParked, recordParkAction, parkFailed, clearParked string
	// selectParkedOf is selectParked for one projection, read by a batch whose status counts
	// parked streams.
	selectParkedOf string
	// selectBatchStatus is selectStatus for a batch: with the version record's drop time, and
	// whether the projection's versions need the batch to read its version record in full
	// (selectVersionInfo, selectClaims).
	selectBatchStatus string
	// selectParkActions reads recorded actions on parked streams, newest first.
	selectParkActions string
	// selectAllStatus is selectStatus for every projection, by name; selectPartitionStatus
	// for the partitions of one, by index.
	selectAllStatus, selectPartitionStatus string
	// eventsExist: see Backend.Register.
	eventsExist string
	// Partitions: see partition.go.
	registerPartition, partitionCount string
	// Versions: see version.go.
	legacyVersion, registerVersion, selectVersionState, selectActiveVersion, selectVersionInfo      string
	selectPartitionPositions, selectPartitionNames                                                  string
	retireActive, activateVersion, markDropped, deleteVersion, deadLettersExist, pendingDeadLetters string
	recordAdopted, selectVersionTables                                                              string
	// Claims: see claim.go.
	selectClaims, claimActive, selectActivePositions string
}

// lagWindow bounds the events a status reads to count a projection's lag: up to that many,
// LagEvents is exact; beyond, the rest is estimated from global positions.
const lagWindow = 1000

// lockClass is the first key of the advisory locks on projections ("nudg" in ASCII). Two-key
// advisory locks live apart from single-key ones, so these cannot collide with the
// application's own pg_advisory_xact_lock(bigint) locks.
const lockClass = "1853187175"

const statusColumns = `p.name, p.transaction_id, p.global_position, p.state, p.events_processed, coalesce(p.last_error, ''),
	p.failing_transaction_id, p.failing_global_position, p.failing_event_id, p.failing_event_type, p.failing_stream_id,
	p.attempts, p.first_failed_at, p.last_failed_at, p.rebuild_started_at, p.updated_at,
	k.event_id, k.event_type, k.stream_id, k.transaction_id, k.global_position, k.skipped_by, k.reason, k.forced, k.skipped_at,
	p.event_types, coalesce(pk.n, 0), pk.oldest,
	v.version, v.state, v.retired_at, av.version, p.partition_of, p.partition_index, p.partition_count,
	p.state_changed_by, p.state_changed_at`

// batchStatusColumns are statusColumns as a batch reads them (selectBatchStatus): without the
// last skip, the oldest parked stream's time and the active version, which are NULL, and with
// the parked streams counted alone.
const batchStatusColumns = `p.name, p.transaction_id, p.global_position, p.state, p.events_processed, coalesce(p.last_error, ''),
	p.failing_transaction_id, p.failing_global_position, p.failing_event_id, p.failing_event_type, p.failing_stream_id,
	p.attempts, p.first_failed_at, p.last_failed_at, p.rebuild_started_at, p.updated_at,
	NULL::uuid, NULL::text, NULL::text, NULL::xid8, NULL::bigint, NULL::text, NULL::text, NULL::bool, NULL::timestamptz,
	p.event_types, (SELECT count(*) FROM {parked} x WHERE x.projection = p.name), NULL::timestamptz,
	v.version, v.state, v.retired_at, NULL::int, p.partition_of, p.partition_index, p.partition_count,
	p.state_changed_by, p.state_changed_at`

// statusFrom is the FROM clause of the status queries: the status row and its last skip.
const statusFrom = `FROM {projections} p
	LEFT JOIN LATERAL (SELECT * FROM {skips} s WHERE s.projection = p.name ORDER BY s.id DESC LIMIT 1) k ON true
	LEFT JOIN LATERAL (SELECT count(*) AS n, min(parked_at) AS oldest FROM {parked} x WHERE x.projection = p.name) pk ON true
	LEFT JOIN {versions} v ON v.unit = coalesce(p.partition_of, p.name)
	LEFT JOIN {versions} av ON av.projection = v.projection AND av.state = 'active'`

func newStatements(schema, horizon string) statements {
	table := func(name string) string {
		if schema == "" {
			return name
		}
		return pgx.Identifier{schema, name}.Sanitize()
	}
	r := strings.NewReplacer("{projections}", table("nudge_projections"), "{events}", table("nudge_events"), "{skips}", table("nudge_projection_skips"),
		"{parked}", table("nudge_projection_parked"), "{versions}", table("nudge_projection_versions"), "{deadletters}", table("nudge_dead_letters"), "{park_actions}", table("nudge_projection_park_actions"),
		"{columns}", statusColumns, "{class}", lockClass, "{schema}", schema, "{horizon}", horizon, "{window}", strconv.Itoa(lagWindow))
	var s statements
	s.addMigrationSQL(r)
	s.addStatusSQL(r)
	s.addStatusesSQL(r)
	s.addWriteSQL(r)
	s.addAttemptSQL(r)
	s.addParkSQL(r)
	s.addVersionSQL(r)
	s.addClaimSQL(r)
	s.addPartitionSQL(r)
	return s
}

// addMigrationSQL adds the statement of Migrate: whether the store's table exists (the
// conditions view is the driver core's, package postgres).
func (s *statements) addMigrationSQL(r *strings.Replacer) {
	s.eventsExist = r.Replace(`SELECT to_regclass('{events}') IS NOT NULL`)
}

// addStatusSQL adds the statements that lock, register and read a projection's status row,
// and compute its lag.
func (s *statements) addStatusSQL(r *strings.Replacer) {
	s.lock = r.Replace(`SELECT pg_advisory_xact_lock({class}, hashtext('{schema}.' || $1))`)
	s.lockAsync = s.lock + `, set_config('synchronous_commit', 'off', true)`
	s.register = r.Replace(`INSERT INTO {projections} AS p (name, event_types) VALUES ($1, $2)
		ON CONFLICT (name) DO UPDATE SET event_types = EXCLUDED.event_types
		WHERE p.event_types IS DISTINCT FROM EXCLUDED.event_types`)
	s.selectStatus = r.Replace(`SELECT {columns} ` + statusFrom + ` WHERE p.name = $1`)
	// A version record needs the full read when the unit's version is building (its active
	// version's position, pace and claims), or retired but not dropped, or when another version
	// of the projection is building (its claims) or retired and not dropped yet (the active
	// version drops it): with none of these, the state and the retirement read here are all
	// of it.
	//
	// A batch reads neither the last skip, nor when the oldest parked stream was parked, nor
	// the active version's number: the statement leaves those columns NULL (and their joins
	// out), and counts the parked streams alone.
	s.selectBatchStatus = r.Replace(`SELECT ` + batchStatusColumns + `, v.dropped_at, EXISTS (SELECT FROM {versions} o WHERE o.projection = v.projection
			AND (o.state = 'building' OR o.state = 'retired' AND o.dropped_at IS NULL))
		FROM {projections} p LEFT JOIN {versions} v ON v.unit = coalesce(p.partition_of, p.name) WHERE p.name = $1`)
	s.selectAllStatus = r.Replace(`SELECT {columns} ` + statusFrom + ` ORDER BY p.name`)
	s.selectPartitionStatus = r.Replace(`SELECT {columns} ` + statusFrom + ` WHERE p.partition_of = $1 ORDER BY p.partition_index`)
	// The store's head; the projection's readable lag counted in a window of at most
	// lagWindow events after its position — in read order for a projection of every type,
	// else per type through the type index, so the window holds only its own events and
	// the work is bounded whatever the backlog and the mix of types; the window's last
	// global position, from which the rest is estimated; and whether committed events of
	// its types wait behind the horizon. The horizon is compared as a scalar subquery, so
	// it is an index condition (a join with h would walk the index from its start). The
	// statement is prepared, and PostgreSQL may plan it once for every parameter value: the
	// per-type window bounds the type index's own key from both sides (type and position
	// above, type and horizon below: together, that type only), which no other index can
	// serve, and "held" compares the newest transaction id (of each type) with the horizon,
	// so that no plan falls back to a scan of the table or of every type.
	s.lag = r.Replace(`WITH h AS MATERIALIZED (SELECT {horizon} AS xmin),
		head AS (
			SELECT e.transaction_id, e.global_position FROM {events} e
			WHERE e.transaction_id < (SELECT xmin FROM h) ORDER BY e.transaction_id DESC, e.global_position DESC LIMIT 1
		),
		win AS MATERIALIZED (
			(SELECT e.transaction_id, e.global_position, e.recorded_at FROM {events} e
			WHERE $3::text[] IS NULL AND (e.transaction_id, e.global_position) > ($1::xid8, $2::bigint)
				AND e.transaction_id < (SELECT xmin FROM h)
			ORDER BY e.transaction_id, e.global_position LIMIT {window})
			UNION ALL
			(SELECT w.transaction_id, w.global_position, w.recorded_at FROM unnest($3::text[]) t(type), LATERAL (
				SELECT e.transaction_id, e.global_position, e.recorded_at FROM {events} e
				WHERE (e.event_type, e.transaction_id, e.global_position) > (t.type, $1::xid8, $2::bigint)
					AND (e.event_type, e.transaction_id) < (t.type, (SELECT xmin FROM h))
				ORDER BY e.event_type, e.transaction_id, e.global_position LIMIT {window}) w
			ORDER BY w.transaction_id, w.global_position LIMIT {window})
		),
		lag AS (SELECT count(*) AS events, min(global_position) AS first, max(global_position) AS last, min(recorded_at) AS oldest FROM win),
		held AS (
			SELECT coalesce(CASE WHEN $3::text[] IS NULL
				THEN (SELECT max(e.transaction_id) FROM {events} e)
				ELSE (SELECT max((SELECT max(e.transaction_id) FROM {events} e WHERE e.event_type = t.type)) FROM unnest($3::text[]) t(type))
				END >= (SELECT xmin FROM h), false) AS held
		)
		SELECT coalesce((SELECT transaction_id FROM head), '0'::xid8), coalesce((SELECT global_position FROM head), 0),
			lag.events, coalesce(lag.first, 0), coalesce(lag.last, 0), extract(epoch FROM clock_timestamp() - lag.oldest)::float8, held.held
		FROM lag, held`)
}

// addStatusesSQL adds the statement of Statuses: the lag of many projections at once.
func (s *statements) addStatusesSQL(r *strings.Replacer) {
	// lags is lag for every (position, types) key of Statuses at once, one row per key in
	// order ($1, $2 and $3 in step; $3 a JSON array holding each key's types, null for every
	// type). The horizon, the head and the newest transaction id of each type are read once
	// for all keys, in one snapshot; each key's window is lag's, bounded the same way.
	s.lags = r.Replace(`WITH h AS MATERIALIZED (SELECT {horizon} AS xmin),
		head AS MATERIALIZED (
			SELECT e.transaction_id, e.global_position FROM {events} e
			WHERE e.transaction_id < (SELECT xmin FROM h) ORDER BY e.transaction_id DESC, e.global_position DESC LIMIT 1
		),
		k AS MATERIALIZED (
			SELECT k.ord, k.tx, k.pos, CASE WHEN jsonb_typeof(k.types) = 'array'
				THEN ARRAY(SELECT jsonb_array_elements_text(k.types)) END AS types
			FROM unnest($1::xid8[], $2::bigint[], ARRAY(SELECT jsonb_array_elements($3::jsonb))) WITH ORDINALITY k(tx, pos, types, ord)
		),
		newest AS MATERIALIZED (
			SELECT t.type, (SELECT max(e.transaction_id) FROM {events} e WHERE e.event_type = t.type) AS xid
			FROM (SELECT DISTINCT unnest(k.types) AS type FROM k) t
		),
		newest_any AS MATERIALIZED (
			SELECT max(e.transaction_id) AS xid FROM {events} e WHERE EXISTS (SELECT FROM k WHERE k.types IS NULL)
		)
		SELECT coalesce((SELECT transaction_id FROM head), '0'::xid8), coalesce((SELECT global_position FROM head), 0),
			lag.events, coalesce(lag.first, 0), coalesce(lag.last, 0), extract(epoch FROM clock_timestamp() - lag.oldest)::float8,
			coalesce(CASE WHEN k.types IS NULL
				THEN (SELECT xid FROM newest_any)
				ELSE (SELECT max(n.xid) FROM newest n WHERE n.type = ANY(k.types))
				END >= (SELECT xmin FROM h), false)
		FROM k, LATERAL (
			SELECT count(*) AS events, min(win.global_position) AS first, max(win.global_position) AS last, min(win.recorded_at) AS oldest FROM (
				(SELECT e.transaction_id, e.global_position, e.recorded_at FROM {events} e
				WHERE k.types IS NULL AND (e.transaction_id, e.global_position) > (k.tx, k.pos)
					AND e.transaction_id < (SELECT xmin FROM h)
				ORDER BY e.transaction_id, e.global_position LIMIT {window})
				UNION ALL
				(SELECT w.transaction_id, w.global_position, w.recorded_at FROM unnest(k.types) t(type), LATERAL (
					SELECT e.transaction_id, e.global_position, e.recorded_at FROM {events} e
					WHERE (e.event_type, e.transaction_id, e.global_position) > (t.type, k.tx, k.pos)
						AND (e.event_type, e.transaction_id) < (t.type, (SELECT xmin FROM h))
					ORDER BY e.event_type, e.transaction_id, e.global_position LIMIT {window}) w
				ORDER BY w.transaction_id, w.global_position LIMIT {window})
			) win
		) lag
		ORDER BY k.ord`)
}

// addWriteSQL adds the statements that change a projection's status row: a batch's outcome, a
// skip, a failure, a reset, a state change, a deletion.
func (s *statements) addWriteSQL(r *strings.Replacer) {
	// The position's advance; advanceClearing also empties the failure fields (a batch that
	// passed the failing event). Two statements, not one with a CASE per failure field: the
	// common advance then writes only what it changes.
	advance := `UPDATE {projections} SET
			transaction_id = $2, global_position = $3, events_processed = events_processed + $4, state = $5,{clear}
			attempt_transaction_id = NULL, attempt_global_position = NULL, attempt_starts = 0,
			careful_transaction_id = CASE WHEN ($2::xid8, $3::bigint) >= (careful_transaction_id, careful_global_position)
				THEN NULL ELSE careful_transaction_id END,
			careful_global_position = CASE WHEN ($2::xid8, $3::bigint) >= (careful_transaction_id, careful_global_position)
				THEN NULL ELSE careful_global_position END,
			updated_at = now()
		WHERE name = $1`
	s.advance = r.Replace(strings.ReplaceAll(advance, "{clear}", ""))
	s.advanceClearing = r.Replace(strings.ReplaceAll(advance, "{clear}", `
			last_error = NULL, failing_transaction_id = NULL, failing_global_position = NULL, failing_event_id = NULL,
			failing_event_type = NULL, failing_stream_id = NULL, attempts = 0, first_failed_at = NULL, last_failed_at = NULL,`))
	s.advanceClock = s.advance + " RETURNING clock_timestamp()"
	s.advanceClearingClock = s.advanceClearing + " RETURNING clock_timestamp()"
	s.recordSkip = r.Replace(`INSERT INTO {skips} (projection, event_id, event_type, stream_id, transaction_id, global_position,
			skipped_by, reason, forced, skipped_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`)
	// Recorded only while the position is still before the failing event: another worker
	// may have handled it meanwhile.
	s.recordFailure = r.Replace(`UPDATE {projections} SET
			state = CASE WHEN state = 'paused' THEN 'paused' ELSE 'failing' END,
			attempts = CASE WHEN failing_event_id = $4 THEN attempts + 1 ELSE 1 END,
			first_failed_at = CASE WHEN failing_event_id = $4 THEN first_failed_at ELSE $8 END,
			last_failed_at = $8, last_error = $7,
			failing_transaction_id = $2, failing_global_position = $3, failing_event_id = $4,
			failing_event_type = $5, failing_stream_id = $6, updated_at = now()
		WHERE name = $1 AND (transaction_id, global_position) < ($2::xid8, $3::bigint)`)
	s.reset = r.Replace(`UPDATE {projections} SET
			transaction_id = '0', global_position = 0, state = 'rebuilding', events_processed = 0,
			last_error = NULL, failing_transaction_id = NULL, failing_global_position = NULL,
			failing_event_id = NULL, failing_event_type = NULL, failing_stream_id = NULL, attempts = 0,
			first_failed_at = NULL, last_failed_at = NULL, rebuild_started_at = now(), updated_at = now(),
			attempt_transaction_id = NULL, attempt_global_position = NULL, attempt_starts = 0,
			careful_transaction_id = NULL, careful_global_position = NULL
		WHERE name = $1`)
	s.setState = r.Replace(`UPDATE {projections} SET state = $2, updated_at = now() WHERE name = $1`)
	// setStateBy is setState recording who paused or resumed the projection ($3, NULL when
	// empty) and when.
	s.setStateBy = r.Replace(`UPDATE {projections} SET state = $2, updated_at = now(), state_changed_by = NULLIF($3, ''),
			state_changed_at = now() WHERE name = $1`)
	s.unitsOf = r.Replace(`SELECT name FROM {projections} WHERE name = $1 OR partition_of = $1 ORDER BY partition_index NULLS FIRST`)
	s.delete = r.Replace(`DELETE FROM {projections} WHERE name = $1`)
}

// addAttemptSQL adds the statements of crash-loop tracking: a batch's start and its end.
func (s *statements) addAttemptSQL(r *strings.Replacer) {
	// $4: extend the careful range to ($5, $6) and restart the count.
	s.startAttempt = r.Replace(`UPDATE {projections} SET
			attempt_starts = CASE
				WHEN $4 THEN 1
				WHEN (attempt_transaction_id, attempt_global_position) IS NOT DISTINCT FROM ($2::xid8, $3::bigint) THEN attempt_starts + 1
				ELSE 1 END,
			attempt_transaction_id = $2, attempt_global_position = $3,
			careful_transaction_id = CASE WHEN $4 THEN $5::xid8 ELSE careful_transaction_id END,
			careful_global_position = CASE WHEN $4 THEN $6::bigint ELSE careful_global_position END
		WHERE name = $1
		RETURNING attempt_starts, coalesce(careful_transaction_id, '0'), coalesce(careful_global_position, 0)`)
	// $2 NULL: at any position.
	s.endAttempt = r.Replace(`UPDATE {projections} SET attempt_transaction_id = NULL, attempt_global_position = NULL, attempt_starts = 0
		WHERE name = $1 AND attempt_starts > 0
			AND ($2::xid8 IS NULL OR (attempt_transaction_id, attempt_global_position) = ($2::xid8, $3::bigint))`)
}

// rowInfo is what a status row records beside the status: the event types the projection
// handled when it was last registered (nil: every type, or not recorded yet) and the
// partition the row reads (the zero Partition: the whole log).
type rowInfo struct {
	types []string
	part  eventstore.Partition
}

// scanStatus reads a row of statusColumns: the status without lag fields, and its rowInfo.
func scanStatus(row pgx.Row) (projection.Status, rowInfo, error) {
	return scanStatusWith(row)
}

// scanStatusWith is scanStatus of a statement whose status columns are followed by more,
// scanned into extra.
func scanStatusWith(row pgx.Row, extra ...any) (projection.Status, rowInfo, error) {
	var (
		st                             projection.Status
		info                           rowInfo
		partIndex, partCount           *int
		partOf                         *string
		state                          string
		failTx, skipTx                 *uint64
		failPos, skipPos               *int64
		failID, skipID                 *[16]byte
		failType, failStream           *string
		firstFail, lastFail, rebuiltAt *time.Time
		skipType, skipStream           *string
		skipBy, skipReason             *string
		skipForced                     *bool
		skipAt                         *time.Time
		oldestParked                   *time.Time
		version, activeVersion         *int
		versionState                   *string
		retiredAt                      *time.Time
		changedBy                      *string
		changedAt                      *time.Time
	)
	dest := append([]any{&st.Name, &st.Position.TransactionID, &st.Position.GlobalPosition, &state, &st.EventsProcessed,
		&st.LastError, &failTx, &failPos, &failID, &failType, &failStream, &st.Attempts, &firstFail, &lastFail,
		&rebuiltAt, &st.UpdatedAt, &skipID, &skipType, &skipStream, &skipTx, &skipPos, &skipBy, &skipReason,
		&skipForced, &skipAt, &info.types, &st.ParkedStreams, &oldestParked, &version, &versionState, &retiredAt, &activeVersion,
		&partOf, &partIndex, &partCount, &changedBy, &changedAt}, extra...)
	if err := row.Scan(dest...); err != nil {
		return st, info, err
	}
	info.part = eventstore.Partition{Index: deref(partIndex), Count: deref(partCount)}
	st.PartitionOf, st.Partition = deref(partOf), info.part
	if skipID != nil {
		st.LastSkip = &projection.SkipRecord{
			Event: eventstore.EventRef{ID: *skipID, Type: deref(skipType), StreamID: deref(skipStream),
				Position: eventstore.Position{TransactionID: deref(skipTx), GlobalPosition: deref(skipPos)}},
			By: deref(skipBy), Reason: deref(skipReason), Forced: deref(skipForced), At: deref(skipAt),
		}
	}
	var err error
	if st.State, err = projection.ParseState(state); err != nil {
		return st, info, err
	}
	if failID != nil {
		st.FailingEvent = &eventstore.EventRef{ID: *failID, Type: deref(failType), StreamID: deref(failStream)}
		if failTx != nil && failPos != nil {
			st.FailingEvent.Position.TransactionID, st.FailingEvent.Position.GlobalPosition = *failTx, *failPos
		}
	}
	st.FirstFailureAt, st.LastFailureAt, st.RebuildStartedAt = deref(firstFail), deref(lastFail), deref(rebuiltAt)
	st.OldestParkedAt = deref(oldestParked)
	st.Version, st.ActiveVersion, st.VersionState = max(deref(version), 1), deref(activeVersion), projection.VersionState(deref(versionState))
	st.RetiredAt = deref(retiredAt)
	st.StateChangedBy, st.StateChangedAt = deref(changedBy), deref(changedAt)
	return st, info, nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func seconds(s *float64) time.Duration {
	if s == nil || *s < 0 {
		return 0
	}
	return time.Duration(*s * float64(time.Second))
}

// parkedColumns are the columns of a parked stream, as scanParked reads them.
const parkedColumns = `projection, stream_id, event_id, event_type, transaction_id, global_position, stream_version, error, attempts,
	parked_at, held_events, coalesce(last_held_transaction_id, '0'), coalesce(last_held_global_position, 0)`

// addParkSQL adds the statements of parked streams.
func (s *statements) addParkSQL(r *strings.Replacer) {
	s.selectParked = r.Replace(`SELECT ` + parkedColumns + ` FROM {parked}
		WHERE ($1::text IS NULL OR projection = $1) AND ($2::text IS NULL OR stream_id = $2)
		ORDER BY projection, transaction_id, global_position, stream_id`)
	s.selectParkActions = r.Replace(`SELECT projection, stream_id, action, event_id, transaction_id, global_position, held_events,
			error, done_by, reason, done_at FROM {park_actions}
		WHERE projection = $1 AND ($2::text IS NULL OR stream_id = $2) ORDER BY id DESC LIMIT $3`)
	s.selectParkedOf = r.Replace(`SELECT ` + parkedColumns + ` FROM {parked} WHERE projection = $1`)
	s.insertParked = r.Replace(`INSERT INTO {parked} (projection, stream_id, event_id, event_type, transaction_id, global_position,
			stream_version, error, attempts, parked_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`)
	s.addHeld = r.Replace(`UPDATE {parked} SET held_events = held_events + $3,
			last_held_transaction_id = $4, last_held_global_position = $5
		WHERE projection = $1 AND stream_id = $2`)
	s.deleteParked = r.Replace(`DELETE FROM {parked} WHERE projection = $1 AND stream_id = $2`)
	s.recordParkAction = r.Replace(`INSERT INTO {park_actions} (projection, stream_id, action, event_id, transaction_id, global_position,
			held_events, error, done_by, reason, done_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`)
	s.parkFailed = r.Replace(`UPDATE {parked} SET error = $3, attempts = attempts + 1 WHERE projection = $1 AND stream_id = $2`)
	s.clearParked = r.Replace(`DELETE FROM {parked} WHERE projection = $1`)
}

// scanParked reads a row of parkedColumns.
func scanParked(row pgx.Row) (projection.ParkedStream, error) {
	var (
		ps projection.ParkedStream
		id [16]byte
	)
	err := row.Scan(&ps.Projection, &ps.StreamID, &id, &ps.Event.Type, &ps.Event.Position.TransactionID, &ps.Event.Position.GlobalPosition,
		&ps.StreamVersion, &ps.Error, &ps.Attempts, &ps.ParkedAt, &ps.Held, &ps.LastHeld.TransactionID, &ps.LastHeld.GlobalPosition)
	ps.Event.ID, ps.Event.StreamID = id, ps.StreamID
	return ps, err
}
