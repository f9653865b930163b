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
	seed, round, release, claim, leave, list string
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
		// $1 groups, $2 their partition counts: makes sure every partition has a row, in one
		// order (group, partition) whoever runs it.
		seed: r.Replace(`INSERT INTO {leases} (grp, partition)
			SELECT g.grp, p FROM unnest($1::text[], $2::int[]) g(grp, parts), generate_series(0, g.parts - 1) p
			ORDER BY 1, 2
			ON CONFLICT DO NOTHING`),
		// $1 owner, $2 groups, $3 their partition counts, $4 whether the owner stays a member
		// of each (false: closing, no heartbeat), $5 TTL in seconds. It renews the owner's
		// memberships and forgets the groups' members whose membership expired (those another
		// member is forgetting at the same time are skipped, never waited for), renews the
		// leases the owner still holds (owner unchanged, even if expired: no one claimed them),
		// and returns per group the live members (this one included), this member's rank among
		// them, the partitions renewed, and the seconds from now (clock_timestamp(), not the
		// transaction's start) until the next lapse of another member's lease or membership
		// that had not lapsed at the transaction's start (NULL when there is none).
		round: r.Replace(`WITH g AS (
				SELECT * FROM unnest($2::text[], $3::int[], $4::bool[]) AS g(grp, parts, active)
			), hb AS (
				INSERT INTO {members} (grp, owner, joined_at, expires_at)
				SELECT grp, $1, now(), now() + make_interval(secs => $5::float8) FROM g WHERE active
				ON CONFLICT (grp, owner) DO UPDATE SET expires_at = EXCLUDED.expires_at
			), gone AS (
				DELETE FROM {members} m WHERE (m.grp, m.owner) IN (
					SELECT d.grp, d.owner FROM {members} d JOIN g ON d.grp = g.grp
					WHERE d.owner <> $1 AND d.expires_at < now()
					FOR UPDATE OF d SKIP LOCKED)
			), renewed AS (
				UPDATE {leases} l SET expires_at = now() + make_interval(secs => $5::float8)
				FROM g WHERE l.grp = g.grp AND l.owner = $1 AND l.partition < g.parts
				RETURNING l.grp, l.partition
			)
			SELECT g.grp,
				(SELECT count(*) FROM {members} m WHERE m.grp = g.grp AND m.owner <> $1 AND m.expires_at >= now())::int + 1,
				(SELECT count(*) FROM {members} m WHERE m.grp = g.grp AND m.owner < $1 AND m.expires_at >= now())::int,
				ARRAY(SELECT r.partition FROM renewed r WHERE r.grp = g.grp ORDER BY 1),
				(SELECT EXTRACT(EPOCH FROM min(e) - clock_timestamp())::float8 FROM (
					SELECT expires_at e FROM {leases} WHERE grp = g.grp AND owner <> $1 AND expires_at >= now()
					UNION ALL
					SELECT expires_at FROM {members} WHERE grp = g.grp AND owner <> $1 AND expires_at >= now()) x)
			FROM g`),
		// $1 owner, $2 groups, $3 partitions: gives back each (group, partition) pair.
		release: r.Replace(`UPDATE {leases} l SET owner = NULL, expires_at = NULL, acquired_at = NULL
			FROM unnest($2::text[], $3::int[]) g(grp, partition)
			WHERE l.grp = g.grp AND l.partition = g.partition AND l.owner = $1`),
		// $1 owner, $2 TTL in seconds, $3 groups, $4 their partition counts, $5 how many to
		// claim in each: claims up to that many partitions of each group that no one holds or
		// whose lease expired, lowest first, skipping those another member is claiming or
		// renewing at the same time, and returns them.
		claim: r.Replace(`UPDATE {leases} l SET owner = $1, expires_at = now() + make_interval(secs => $2::float8), acquired_at = now()
			FROM (SELECT f.grp, f.partition
				FROM unnest($3::text[], $4::int[], $5::int[]) w(grp, parts, want)
				CROSS JOIN LATERAL (SELECT grp, partition FROM {leases}
					WHERE grp = w.grp AND partition < w.parts AND (owner IS NULL OR expires_at < now())
					ORDER BY partition LIMIT w.want FOR UPDATE SKIP LOCKED) f) free
			WHERE l.grp = free.grp AND l.partition = free.partition
			RETURNING l.grp, l.partition`),
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
