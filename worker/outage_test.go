//go:build !race

// watermill-amqp v2.1.3 writes its connection flag without synchronisation when a connection
// drops (see channel/amqp's package doc), which the race detector reports; `make test` runs
// this file in a second pass without -race.

package worker_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/worker"
)

// TestBrokerOutageWhileRunning: RabbitMQ drops the worker's connection while appends go on;
// the worker and the relay reconnect by themselves and the read model catches up with every
// event, each once.
func TestBrokerOutageWhileRunning(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ch := s.newChannel(t, channels["amqp"])
	s.start(t, ch, worker.Config{SafetyNetInterval: -1}, s.model(t, "alpha", nil))

	for n := range 10 {
		s.append(t, "before", storeEvent(n))
	}
	require.Eventually(t, func() bool { rows, _ := s.count(t, "alpha"); return rows == 10 }, eventually, 10*time.Millisecond)

	for outage := range 3 {
		s.amqp.CloseConnections(t)
		for n := range 10 {
			s.append(t, "during", storeEvent(100*(outage+1)+n))
		}
	}
	require.Eventually(t, func() bool { rows, _ := s.count(t, "alpha"); return rows == 40 }, eventually, 20*time.Millisecond,
		"after the outages every event reached the read model through triggers alone")
	_, wrong := s.count(t, "alpha")
	require.Zero(t, wrong)
}
