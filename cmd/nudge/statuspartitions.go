package main

import (
	"context"
	"fmt"
	"slices"

	"github.com/nudgeworks/nudge/lease"
	"github.com/nudgeworks/nudge/postgres"
	"github.com/nudgeworks/nudge/projection"
)

// foldPartitioned folds the per-partition statuses of the backend's Statuses into one status
// per partitioned projection: projection.FoldPartitioned.
func foldPartitioned(all []projection.Status) []projection.Status {
	return projection.FoldPartitioned(all)
}

// pickStatuses returns the statuses of names, in their order: a projection's by its name, a
// single partition's by its unit name (e.g. orders.p03). It returns unknownProjections for
// names that are neither.
func pickStatuses(folded []projection.Status, names []string) ([]projection.Status, error) {
	if len(names) == 0 {
		return folded, nil
	}
	var (
		out     []projection.Status
		unknown []string
	)
	for _, n := range names {
		if st, ok := findStatus(folded, n); ok {
			out = append(out, st)
			continue
		}
		unknown = append(unknown, n)
	}
	if len(unknown) > 0 {
		return nil, unknownProjections(unknown, folded)
	}
	return out, nil
}

// findStatus finds the projection called name, or the partition unit called name.
func findStatus(folded []projection.Status, name string) (projection.Status, bool) {
	for _, st := range folded {
		if st.Name == name {
			return st, true
		}
		for _, p := range st.Partitions {
			if p.Name == name {
				return p, true
			}
		}
	}
	return projection.Status{}, false
}

// partitionLeases returns the leases of the partitions of st (a partitioned projection or one
// of its partitions), in index order; nil when st is neither, or when there is no lease table
// (the owners are unknown).
func partitionLeases(ctx context.Context, db postgres.DB, schema string, st projection.Status) ([]lease.Lease, error) {
	group, count := st.Name, 0
	switch {
	case st.PartitionOf != "":
		group, count = st.PartitionOf, st.Partition.Count
	case len(st.Partitions) > 0:
		count = max(st.Partitions[0].Partition.Count, len(st.Partitions))
	default:
		return nil, nil
	}
	ls, err := lease.Leases(ctx, db, schema, group, count)
	if isUndefinedTable(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the partition leases of %s: %w", group, err)
	}
	return ls, nil
}

// newStatusRow is st's row: its failed dead letters (nil counts: unknown), and for a
// partitioned projection its partitions' rows, whose dead letters it adds to its own (a
// partition's dead letters are recorded under its unit name). leases are the leases of st's
// partitions, nil when unknown.
func newStatusRow(st projection.Status, counts map[string]int, leases []lease.Lease) statusRow {
	row := statusRow{Status: st}
	if counts != nil {
		n := counts[st.Name]
		row.deadLetters = &n
	}
	if st.PartitionOf != "" && st.Partition.Index < len(leases) {
		l := leases[st.Partition.Index]
		row.lease = &l
	}
	for _, p := range st.Partitions {
		pr := newStatusRow(p, counts, leases)
		if row.deadLetters != nil {
			*row.deadLetters += *pr.deadLetters
		}
		row.partitions = append(row.partitions, pr)
	}
	return row
}

// ownersUnknown reports whether a row of rows shows partitions whose owners are unknown (no
// lease table).
func ownersUnknown(rows []statusRow) bool {
	for _, r := range rows {
		if (r.PartitionOf != "" && r.lease == nil) || ownersUnknown(r.partitions) {
			return true
		}
	}
	return false
}

// owners returns the distinct live owners of a partitioned projection's partitions, sorted,
// and how many partitions no one owns; known is false when a partition's lease is unknown.
func (r statusRow) owners() (owners []string, unowned int, known bool) {
	owners = []string{}
	for _, p := range r.partitions {
		switch {
		case p.lease == nil:
			return nil, 0, false
		case p.lease.Owner == "":
			unowned++
		case !slices.Contains(owners, p.lease.Owner):
			owners = append(owners, p.lease.Owner)
		}
	}
	slices.Sort(owners)
	return owners, unowned, true
}

// ownerNote is the note of a partitioned projection ("16 partitions, 3 owners", with the
// partitions no one owns) or of a partition (its owner, or unowned); "" for other rows.
func ownerNote(r statusRow) string {
	switch {
	case r.PartitionOf != "" && r.lease == nil:
		return "owner ?"
	case r.PartitionOf != "" && r.lease.Owner == "":
		return "unowned"
	case r.PartitionOf != "":
		return "owner " + r.lease.Owner
	case len(r.partitions) == 0:
		return ""
	}
	note := fmt.Sprintf("%d partitions", len(r.partitions))
	owners, unowned, known := r.owners()
	switch {
	case !known:
		return note
	case len(owners) == 0:
		return note + ", no owner"
	case len(owners) == 1:
		note += ", 1 owner"
	default:
		note += fmt.Sprintf(", %d owners", len(owners))
	}
	if unowned > 0 {
		note += fmt.Sprintf(", %d unowned", unowned)
	}
	return note
}

// partitionsJSON adds the partition fields of r to out.
func partitionsJSON(out *statusJSON, r statusRow) {
	out.PartitionCount = 1
	if r.PartitionOf != "" {
		index := r.Partition.Index
		out.PartitionOf, out.Partition, out.PartitionCount = r.PartitionOf, &index, r.Partition.Count
		if r.lease != nil && r.lease.Owner != "" {
			owner := r.lease.Owner
			out.Owner, out.LeaseExpiresAt = &owner, utcOrNil(r.lease.ExpiresAt)
		}
	}
	if len(r.partitions) == 0 {
		return
	}
	out.PartitionCount, out.FailingPartition = len(r.partitions), r.FailingPartition
	if owners, _, known := r.owners(); known {
		out.Owners = owners
	}
	out.Partitions = make([]statusJSON, len(r.partitions))
	for k, p := range r.partitions {
		out.Partitions[k] = toStatusJSON(p)
	}
}
