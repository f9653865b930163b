package postgres

import (
	"slices"

	"github.com/nudgeworks/nudge/eventstore"
)

// readTypes returns the statement that reads opts.Types (see readTypeSQL) and its types
// argument: the type alone when there is one, else the types sorted, each once (a type named
// twice would be read twice).
func (s *Store) readTypes(opts eventstore.ReadOptions) (string, any) {
	types := slices.Compact(slices.Sorted(slices.Values(opts.Types)))
	if len(types) == 1 {
		return s.sql.readType[omit(opts)], types[0]
	}
	return s.sql.readTypes[omit(opts)], types
}
