package amqp

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
)

// topicMatch is RabbitMQ's topic matching of a pattern without "#": as many words as the key,
// "*" matching any word.
func topicMatch(pattern, key []string) bool {
	if len(pattern) != len(key) {
		return false
	}
	for i, w := range pattern {
		if w != "*" && w != key[i] {
			return false
		}
	}
	return true
}

// TestRoutingKeysMatchTheirPartitionOnly checks, for every count from 2 to MaxPartitions and
// keys of every kind, that a key's routing key matches the binding of the partition it falls
// in and no other, except for counts with a prime factor above 31, whose units bind "#".
func TestRoutingKeysMatchTheirPartitionOnly(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	keys := []uint32{0, 1, 2, 1023, 1024, 0x7fffffff}
	for range 10 {
		keys = append(keys, rng.Uint32()&0x7fffffff)
	}
	routing := make([][]string, len(keys))
	for i, k := range keys {
		rk := routingKey(k)
		require.LessOrEqual(t, len(rk), 255, "a routing key is a short string")
		routing[i] = strings.Split(rk, ".")
	}
	precise := 0
	for count := 2; count <= eventstore.MaxPartitions; count++ {
		for index := range count {
			pattern := bindingKey(index, count)
			if pattern == "#" {
				continue
			}
			if index == 0 {
				precise++
			}
			words := strings.Split(pattern, ".")
			require.NotContains(t, words, "#", pattern)
			for i, k := range keys {
				require.Equal(t, int(k%uint32(count)) == index, topicMatch(words, routing[i]),
					"key %d, partition %d of %d (%s vs %s)", k, index, count, pattern, routingKey(k))
			}
		}
	}
	require.Equal(t, "#", bindingKey(0, 37), "37 is above the sections' primes")
	require.Equal(t, "#", bindingKey(3, 74))
	require.Greater(t, precise, 400, "most counts are routed precisely")
}
