package projection_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	memstore "github.com/nudgeworks/nudge/eventstore/memory"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/memory"
	"github.com/nudgeworks/nudge/projection/projectiontest"
)

// lockedBuffer is a bytes.Buffer a logger may write to from any goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestTextLogsQuoteControlCharacters: the runner logs the error and event type of a failure as
// attributes, so slog's TextHandler quotes them: an error that quotes a payload holding an ANSI
// sequence, a carriage return, a C1 control and invalid UTF-8 (as PostgreSQL's "invalid input
// syntax" errors do) reaches a text log escaped, never raw.
func TestTextLogsQuoteControlCharacters(t *testing.T) {
	t.Parallel()
	const hostileType = "Bad\x1b[2J"
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	backend, err := memory.New(store, memory.Config{})
	require.NoError(t, err)
	projectiontest.AppendN(t, store, 0, 1, hostileType)

	p, err := projection.New("logged", projection.Config{}, projection.OnIdempotent(hostileType,
		func(context.Context, projection.Event[map[string]any]) error {
			return errors.New("invalid input syntax for type integer: \"\x1b[31mred\rX\u009b\xff\"")
		}))
	require.NoError(t, err)
	var logs lockedBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: logger}, p)
	require.NoError(t, err)
	require.NoError(t, r.Init(context.Background()))
	_, err = r.CatchUp(context.Background(), "logged")
	require.ErrorIs(t, err, projection.ErrHandler)

	out := logs.String()
	require.Contains(t, out, `event_type="Bad\x1b[2J"`)
	require.Contains(t, out, `\"\x1b[31mred\rX\u009b\xff\"`, "the error is quoted the way Go quotes strings")
	for _, raw := range []string{"\x1b", "\r", "\u009b", "\xff"} {
		require.NotContains(t, out, raw)
	}
}
