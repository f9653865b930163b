package amqp_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel/amqp"
)

// TestMalformedURLsKeepThePassword: URLs that url.Parse reads as a path or an opaque part are
// refused without printing their password, in the error or the log.
func TestMalformedURLsKeepThePassword(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"amqp//guest:S3CR3T@host":  "amqp//guest:xxxxx@host is not an AMQP URL",
		"amqp:/guest:S3CR3T@host":  "amqp:/guest:xxxxx@host names no host",
		"guest:S3CR3T@host:5672":   "guest:xxxxx@host:5672 is not an AMQP URL",
		"amqp:guest:S3CR3T@host/v": "amqp:xxxxx@host/v names no host",
	} {
		l := newLogs(t)
		_, err := amqp.New(context.Background(), amqp.Config{URL: raw, Logger: l.logger()})
		require.ErrorContains(t, err, want, raw)
		require.NotContains(t, err.Error(), "S3CR3T", raw)
		require.NotContains(t, l.String(), "S3CR3T", raw)
	}
}
