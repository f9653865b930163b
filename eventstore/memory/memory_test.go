package memory_test

import (
	"testing"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/memory"
	"github.com/nudgeworks/nudge/eventstore/storetest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(*testing.T) eventstore.Store { return memory.New(memory.Config{}) })
}
