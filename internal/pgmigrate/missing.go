package pgmigrate

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Missing reports whether err says that a component was never migrated on this database: it is
// PostgreSQL's undefined_table (SQLSTATE 42P01) for one of tables — the tables its Migrate
// creates —, or invalid_schema_name (3F000) for schema, when the component lives in a schema of
// its own. The relation or schema must be named in the message as a whole word (qualified or
// not), whatever the server's message language: an error about a user's table, a read model's
// in a hook, say, is not one.
func Missing(err error, schema string, tables ...string) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch {
	case pgErr.Code == "42P01":
		for _, table := range tables {
			if names(pgErr.Message, table) {
				return true
			}
		}
	case pgErr.Code == "3F000" && schema != "":
		return names(pgErr.Message, schema)
	}
	return false
}

// names reports whether msg holds name as a whole word.
func names(msg, name string) bool {
	for rest := msg; ; {
		i := strings.Index(rest, name)
		if i < 0 {
			return false
		}
		before, after := rest[:i], rest[i+len(name):]
		if !endsInName(before) && !startsName(after) {
			return true
		}
		rest = after
	}
}

// startsName reports whether s begins with a character that continues an identifier.
func startsName(s string) bool {
	return s != "" && isNameByte(s[0])
}

// endsInName reports whether s ends in a character that an identifier could begin with, so
// that a table name right after it would be the tail of a longer name.
func endsInName(s string) bool {
	return s != "" && isNameByte(s[len(s)-1])
}

func isNameByte(c byte) bool {
	return c == '_' || c == '$' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}
