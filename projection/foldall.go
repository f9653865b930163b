package projection

import (
	"cmp"
	"slices"
	"strings"
)

// FoldPartitioned folds the per-partition statuses in all (as a backend's Statuses returns
// them) into one status per partitioned projection (FoldPartitions, its partitions in index
// order in Partitions), keeps every other status as it is, and sorts the result by name. The
// operator CLI's status and the console show it.
func FoldPartitioned(all []Status) []Status {
	parts := map[string][]Status{}
	out := make([]Status, 0, len(all))
	for _, st := range all {
		if st.PartitionOf == "" {
			out = append(out, st)
			continue
		}
		parts[st.PartitionOf] = append(parts[st.PartitionOf], st)
	}
	for name, ps := range parts {
		slices.SortFunc(ps, func(a, b Status) int { return cmp.Compare(a.Partition.Index, b.Partition.Index) })
		out = append(out, FoldPartitions(name, ps))
	}
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.Name, b.Name) })
	return out
}
