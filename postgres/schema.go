package postgres

import (
	"errors"
	"fmt"
	"regexp"
)

// ErrInvalidSchema matches an error of ValidateSchema: a schema name nudge does not use.
var ErrInvalidSchema = errors.New("postgres: invalid schema name")

// schemaName is the rule for schema names: an unquoted PostgreSQL identifier, lowercase, so it
// needs no quoting in operators' SQL and fits PostgreSQL's 63 bytes.
var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidateSchema returns nil if schema can hold nudge's tables: "" (the connection's
// search_path, usually public) or lowercase letters, digits and _, at most 63, not starting
// with a digit. The error matches ErrInvalidSchema. Every component's constructor checks its
// schema with it.
func ValidateSchema(schema string) error {
	if schema == "" || schemaName.MatchString(schema) {
		return nil
	}
	return fmt.Errorf("%w: %q: use lowercase letters, digits and _ (at most 63, not starting with a digit), or \"\" for the search_path",
		ErrInvalidSchema, schema)
}
