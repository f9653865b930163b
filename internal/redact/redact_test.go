package redact_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/redact"
)

func TestURL(t *testing.T) {
	t.Parallel()
	require.Equal(t, "amqp://guest:xxxxx@host:5672/", redact.URL("amqp://guest:s3cret@host:5672/"))
	require.Equal(t, "postgres://postgres@host/db", redact.URL("postgres://postgres@host/db"))
	require.Equal(t, "(unparsable URL)", redact.URL("postgres://u:p@host:port\x7f/db"))
}

func TestMessage(t *testing.T) {
	t.Parallel()
	require.Equal(t, "dial xxxxx failed, xxxxx", redact.Message("dial s3cret/x failed, s3cret%2Fx", "postgres://u:s3cret%2Fx@h/db"))
	require.Equal(t, "auth xxxxx", redact.Message("auth hunter2", "host=h user=u password='hunter2'"))
	require.Equal(t, "no password here", redact.Message("no password here", "postgres://u@h/db"))
	require.NotContains(t, redact.Message("bad s3cret", "postgres://u:s3cret@h:x\x7f"), "s3cret")
}

func TestArgs(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"-db", "postgres://u:xxxxx@h/db", "url=amqp://g:xxxxx@h/", "plain"},
		redact.Args([]string{"-db", "postgres://u:pw@h/db", "url=amqp://g:pw@h/", "plain"}))
}
