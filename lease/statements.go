package lease

import (
	"strings"

	"github.com/jackc/pgx/v5"
)

// Tables returns the lease tables, in Config.Schema: the leases and the memberships (migrated
// with the projections' component, postgres.ComponentProjections).
func Tables() []string { return []string{"nudge_partition_leases", "nudge_partition_members"} }

// statements are the member's SQL, with the schema's tables.
type statements struct {
	heartbeat, renew, release, claim, lapse, leave, list string
}

func newStatements(schema string) statements {
	table := func(name string) string {
		if schema == "" {
			return name
		}
		return pgx.Identifier{schema, name}.Sanitize()
	}
	tables := Tables()
	r := strings.NewReplacer("{leases}", table(tables[0]), "{members}", table(tables[1]))
	return statements{
		// $1 group, $2 owner, $3 TTL in seconds, $4 partitions. It renews the membership,
		// forgets members whose membership expired, makes sure every partition has a row, and
		// returns the live members (this one included) and this member's rank among them.
		heartbeat: r.Replace(`WITH hb AS (
				INSERT INTO {members} (grp, owner, joined_at, expires_at)
				VALUES ($1, $2, now(), now() + make_interval(secs => $3::float8))
				ON CONFLICT (grp, owner) DO UPDATE SET expires_at = EXCLUDED.expires_at
			), gone AS (
				DELETE FROM {members} WHERE grp = $1 AND owner <> $2 AND expires_at < now()
			), seed AS (
				INSERT INTO {leases} (grp, partition) SELECT $1, g FROM generate_series(0, $4::int - 1) g
				ON CONFLICT DO NOTHING
			), live AS (
				SELECT owner FROM {members} WHERE grp = $1 AND owner <> $2 AND expires_at >= now()
			)
			SELECT count(*)::int + 1, (count(*) FILTER (WHERE owner < $2))::int FROM live`),
		// Renews the leases the member still holds (owner unchanged, even if expired: no one
		// claimed them) and returns their partitions.
		renew: r.Replace(`UPDATE {leases} SET expires_at = now() + make_interval(secs => $3::float8)
			WHERE grp = $1 AND owner = $2 AND partition < $4
			RETURNING partition`),
		release: r.Replace(`UPDATE {leases} SET owner = NULL, expires_at = NULL, acquired_at = NULL
			WHERE grp = $1 AND owner = $2 AND partition = ANY($3)`),
		// Claims up to $5 partitions that no one holds or whose lease expired, lowest first,
		// skipping those another member is claiming or renewing at the same time.
		claim: r.Replace(`UPDATE {leases} l SET owner = $2, expires_at = now() + make_interval(secs => $3::float8), acquired_at = now()
			FROM (SELECT partition FROM {leases}
				WHERE grp = $1 AND partition < $4 AND (owner IS NULL OR expires_at < now())
				ORDER BY partition LIMIT $5 FOR UPDATE SKIP LOCKED) free
			WHERE l.grp = $1 AND l.partition = free.partition
			RETURNING l.partition`),
		// $1 group, $2 owner. Seconds from now (clock_timestamp(), not the transaction's
		// start) until the next lapse of another member's lease or membership that had not
		// lapsed at the transaction's start; NULL when there is none.
		lapse: r.Replace(`SELECT EXTRACT(EPOCH FROM min(e) - clock_timestamp())::float8 FROM (
				SELECT expires_at e FROM {leases} WHERE grp = $1 AND owner <> $2 AND expires_at >= now()
				UNION ALL
				SELECT expires_at FROM {members} WHERE grp = $1 AND owner <> $2 AND expires_at >= now()) x`),
		leave: r.Replace(`WITH given AS (
				UPDATE {leases} SET owner = NULL, expires_at = NULL, acquired_at = NULL WHERE grp = $1 AND owner = $2
			)
			DELETE FROM {members} WHERE grp = $1 AND owner = $2`),
		list: r.Replace(`SELECT g, l.owner, l.expires_at, l.acquired_at
			FROM generate_series(0, $2::int - 1) g
			LEFT JOIN {leases} l ON l.grp = $1 AND l.partition = g AND l.owner IS NOT NULL AND l.expires_at >= now()
			ORDER BY g`),
	}
}
