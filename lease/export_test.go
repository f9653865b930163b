package lease

import "time"

// SetTimer replaces the timer that schedules the rounds of m's set (before Run): newTimer
// returns a channel that receives when the round is due and a stop function.
func SetTimer(m *Member, newTimer func(d time.Duration) (<-chan time.Time, func() bool)) {
	m.set.newTimer = newTimer
}
