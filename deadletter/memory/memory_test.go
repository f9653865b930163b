package memory_test

import (
	"testing"

	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/deadletter/deadlettertest"
	"github.com/nudgeworks/nudge/deadletter/memory"
)

func TestSuite(t *testing.T) {
	t.Parallel()
	deadlettertest.Run(t, func(*testing.T) deadletter.Store { return memory.New(memory.Config{}) })
}
