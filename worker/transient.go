package worker

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// TransientCause is the default Config.TransientCauseFunc. It names, as "sqlstate <code>", the
// PostgreSQL errors that a later attempt can pass without any fix: serialization failures and
// deadlocks (class 40), lock and statement timeouts (55P03, 57014), lost connections (class
// 08), shutdowns and restarts (57P01–57P03), an idle transaction's timeout (25P03) and
// exhausted resources (class 53). Every other error returns "".
func TransientCause(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return ""
	}
	code := pgErr.Code
	switch {
	case strings.HasPrefix(code, "40"), strings.HasPrefix(code, "08"), strings.HasPrefix(code, "53"):
	case code == "55P03", code == "57014", code == "57P01", code == "57P02", code == "57P03", code == "25P03":
	default:
		return ""
	}
	return "sqlstate " + code
}
