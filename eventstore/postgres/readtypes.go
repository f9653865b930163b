package postgres

import (
	"slices"

	"github.com/nudgeworks/nudge/eventstore"
)

// readTypes returns the statement that reads opts.Types (see readTypeSQL), its types argument
// (the type alone when there is one, else the types sorted, each once) and whether it runs
// with sorting off (readTypesSQL).
func (s *Store) readTypes(opts eventstore.ReadOptions) (sql string, types any, sortless bool) {
	distinct := slices.Compact(slices.Sorted(slices.Values(opts.Types)))
	if len(distinct) == 1 {
		return s.sql.readType[omit(opts)], distinct[0], false
	}
	return s.sql.readTypes[omit(opts)], distinct, true
}
