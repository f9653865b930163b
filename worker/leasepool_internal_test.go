package worker

import "testing"

// TestLeasePoolSize: the lease rounds' pool has a connection per 8 leased projections, at
// least the two it always had and at most 8.
func TestLeasePoolSize(t *testing.T) {
	for groups, want := range map[int]int32{1: 2, 8: 2, 16: 2, 17: 3, 24: 3, 50: 7, 64: 8, 300: 8} {
		if got := leasePoolSize(groups); got != want {
			t.Errorf("leasePoolSize(%d) = %d, want %d", groups, got, want)
		}
	}
}
