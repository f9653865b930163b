package postgres

import (
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/deadletter/internal/clean"
	"github.com/nudgeworks/nudge/eventstore"
)

// statements are the store's SQL with the table name qualified by the configured schema.
type statements struct {
	table         string
	add           string
	get           string
	markReplayed  string
	resolve       string
	resolvePassed string
	// purge is indexed by PurgeOptions.IncludeUnresolved (0: resolved records only).
	purge [2]string
	// list is indexed by listIndex: with or without a projection and a status condition.
	list [4]string
}

const recordColumns = `id, projection, message_uuid, payload, metadata, error,
	failing_transaction_id, failing_global_position, failing_event_id, failing_event_type, failing_stream_id,
	attempts, count, first_failed_at, last_failed_at, status,
	coalesce(replayed_by, ''), replayed_at, replays,
	coalesce(resolved_by, ''), resolved_at, coalesce(resolve_note, ''), updated_at`

func newStatements(schema string) statements {
	table := "nudge_dead_letters"
	if schema != "" {
		table = pgx.Identifier{schema, table}.Sanitize()
	}
	r := strings.NewReplacer("{table}", table, "{columns}", recordColumns)
	st := statements{
		table: table,
		// Folding is one statement: the unique partial index on (projection, fold_key) WHERE
		// status <> 'resolved' turns a second delivery for an open record into an update of it,
		// atomically, however many workers dead-letter the same event at once.
		add: r.Replace(`INSERT INTO {table} AS d (projection, message_uuid, payload, metadata, error,
				failing_transaction_id, failing_global_position, failing_event_id, failing_event_type, failing_stream_id,
				attempts, first_failed_at, last_failed_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $12)
			ON CONFLICT (projection, fold_key) WHERE status <> 'resolved' DO UPDATE SET
				message_uuid = EXCLUDED.message_uuid, payload = EXCLUDED.payload,
				metadata = EXCLUDED.metadata, error = EXCLUDED.error,
				failing_stream_id = coalesce(nullif(d.failing_stream_id, ''), EXCLUDED.failing_stream_id),
				attempts = d.attempts + EXCLUDED.attempts, count = d.count + 1,
				first_failed_at = least(d.first_failed_at, EXCLUDED.first_failed_at),
				last_failed_at = greatest(d.last_failed_at, EXCLUDED.last_failed_at),
				status = 'failed', updated_at = now()
			RETURNING {columns}`),
		get: r.Replace(`SELECT {columns} FROM {table} WHERE id = $1`),
		markReplayed: r.Replace(`UPDATE {table} SET status = 'replayed', replayed_by = $2, replayed_at = $3,
				replays = replays + 1, updated_at = now()
			WHERE id = ANY($1::bigint[]) AND status IN ('failed', 'replayed')`),
		// The outer query reads the snapshot from before the update, so it finds the row whether
		// or not the update changed it.
		resolve: r.Replace(`WITH u AS (
				UPDATE {table} SET status = 'resolved', resolved_by = $2, resolve_note = $3, resolved_at = $4,
					updated_at = now()
				WHERE id = $1 AND status <> 'resolved'
			)
			SELECT EXISTS (SELECT 1 FROM {table} WHERE id = $1)`),
		// One statement; a no-op costs about a millisecond (BenchmarkResolvePassedNothingToDo).
		resolvePassed: r.Replace(`UPDATE {table} SET status = 'resolved', resolved_by = $4, resolve_note = $5,
				resolved_at = $6, updated_at = now()
			WHERE projection = $1 AND status = 'failed' AND failing_event_id IS NOT NULL AND coalesce(metadata ->> $7, '') <> ''
				AND (failing_transaction_id, failing_global_position) <= ($2::xid8, $3::bigint)`),
		purge: [2]string{
			r.Replace(`DELETE FROM {table} WHERE last_failed_at < $1 AND status = 'resolved'`),
			r.Replace(`DELETE FROM {table} WHERE last_failed_at < $1`),
		},
	}
	// Each combination of conditions is its own statement, so every one gets a plan that uses
	// the indexes it can.
	for i := range st.list {
		where, n := []string{"id > $1"}, 2
		if i&listByProjection != 0 {
			n++
			// The projection's records and its partitions' (projection.pNN): an index range
			// for the latter, checked exactly.
			where = append(where, fmt.Sprintf(`(projection = $%[1]d OR (projection >= $%[1]d || '.p0' AND projection <= $%[1]d || '.p9~'
				AND left(projection, length($%[1]d) + 2) = $%[1]d || '.p' AND substr(projection, length($%[1]d) + 3) ~ '^[0-9]+$'))`, n))
		}
		if i&listByStatus != 0 {
			n++
			where = append(where, fmt.Sprintf("status = ANY($%d::text[])", n))
		}
		st.list[i] = r.Replace(`SELECT {columns} FROM {table} WHERE ` + strings.Join(where, " AND ") + ` ORDER BY id LIMIT $2`)
	}
	return st
}

const (
	listByProjection = 1 << iota
	listByStatus
)

// listQuery returns the statement and arguments that list f's records.
func (s statements) listQuery(f deadletter.Filter) (string, []any) {
	i := 0
	args := []any{f.AfterID, f.Limit}
	if f.Projection != "" {
		i |= listByProjection
		args = append(args, f.Projection)
	}
	if len(f.Status) > 0 {
		i |= listByStatus
		statuses := make([]string, len(f.Status))
		for j, st := range f.Status {
			statuses[j] = string(st)
		}
		args = append(args, statuses)
	}
	return s.list[i], args
}

// addArgs are the arguments of the add statement for a normalised entry.
func addArgs(e deadletter.Entry) []any {
	var failTx, failPos, failID, failType, failStream any
	if fe := e.FailingEvent; fe != nil {
		failTx, failPos, failID = fe.Position.TransactionID, fe.Position.GlobalPosition, [16]byte(fe.ID)
		failType, failStream = fe.Type, fe.StreamID
	}
	md := e.Metadata
	if md == nil {
		md = map[string]string{}
	}
	payload := e.Payload
	if payload == nil {
		payload = []byte{}
	}
	return []any{e.Projection, e.MessageUUID, payload, md, e.Error, failTx, failPos, failID, failType, failStream, e.Attempts, e.At}
}

// scanRecord reads a row of recordColumns.
func scanRecord(row pgx.Row) (deadletter.Record, error) {
	var (
		r                                  deadletter.Record
		status                             string
		failTx                             *uint64
		failPos                            *int64
		failID                             *[16]byte
		failType, failStream               *string
		replayedAt, resolvedAt             *time.Time
		payload                            []byte
		metadata                           map[string]string
		firstFailed, lastFailed, updatedAt time.Time
	)
	if err := row.Scan(&r.ID, &r.Projection, &r.MessageUUID, &payload, &metadata, &r.Error,
		&failTx, &failPos, &failID, &failType, &failStream, &r.Attempts, &r.Count, &firstFailed, &lastFailed, &status,
		&r.ReplayedBy, &replayedAt, &r.Replays, &r.ResolvedBy, &resolvedAt, &r.ResolveNote, &updatedAt); err != nil {
		return deadletter.Record{}, err
	}
	var err error
	if r.Status, err = deadletter.ParseStatus(status); err != nil {
		return deadletter.Record{}, err
	}
	if len(payload) > 0 {
		r.Payload = payload
	}
	if len(metadata) > 0 {
		r.Metadata = metadata
	}
	if failID != nil {
		r.FailingEvent = &eventstore.EventRef{ID: uuid.UUID(*failID), Type: deref(failType), StreamID: deref(failStream)}
		r.FailingEvent.Position.TransactionID, r.FailingEvent.Position.GlobalPosition = deref(failTx), deref(failPos)
	}
	r.FirstFailedAt, r.LastFailedAt, r.UpdatedAt = firstFailed.UTC(), lastFailed.UTC(), updatedAt.UTC()
	r.ReplayedAt, r.ResolvedAt = clean.Time(deref(replayedAt)), clean.Time(deref(resolvedAt))
	return r, nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
