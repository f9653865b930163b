package memory_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/memory"
	"github.com/nudgeworks/nudge/eventstore/storetest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(_ *testing.T, limits eventstore.Limits) eventstore.Store {
		return memory.New(memory.Config{Limits: limits})
	})
}

func TestBadLimitsFailEveryAppend(t *testing.T) {
	t.Parallel()
	s := memory.New(memory.Config{Limits: eventstore.Limits{MaxEventBytes: -5}})
	_, err := s.Append(context.Background(), "s", eventstore.Any, storetest.Event("A", 1))
	require.ErrorIs(t, err, eventstore.ErrInvalidInput)
	require.ErrorContains(t, err, "memory: Config: eventstore: invalid input: Limits.MaxEventBytes: -5")
	require.Equal(t, eventstore.Limits{MaxEventBytes: 3, MaxAppendBytes: 16 << 20, MaxAppendEvents: 10_000},
		memory.New(memory.Config{Limits: eventstore.Limits{MaxEventBytes: 3}}).Limits())
}
