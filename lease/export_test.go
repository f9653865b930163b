package lease

import "time"

// SetTimer replaces the timer that schedules the rounds of m's set (before Run): newTimer
// returns a channel that receives when the round is due and a stop function.
func SetTimer(m *Member, newTimer func(d time.Duration) (<-chan time.Time, func() bool)) {
	m.set.newTimer = newTimer
}

// SetBeforeClaim sets the function the rounds of m's set call inside their transaction, after
// renewing and before giving back and claiming (nil: none; before Run).
func SetBeforeClaim(m *Member, f func()) { m.set.beforeClaim = f }

// SetLeaveWaits sets the function a member of m's set calls when its Close finds a round in
// flight, before it waits for the round to end (nil: none; before Run).
func SetLeaveWaits(m *Member, f func()) { m.set.leaveWaits = f }
