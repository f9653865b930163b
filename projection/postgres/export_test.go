package postgres

import "time"

// SetClaimWait sets how long b's claims wait for each lock of an active version, for a test
// whose forced interleaving must not race that bound on a busy machine.
func SetClaimWait(b *Backend, d time.Duration) { b.claimWait = d }
