package projection

import "fmt"

// State is where a projection stands. It is stored as text in the status row.
type State string

const (
	// StateRunning: the projection catches up normally.
	StateRunning State = "running"
	// StateFailing: a handler failed on the event named in the status (FailingEvent); the
	// position stops right before it. The next successful catch-up past it returns to running.
	StateFailing State = "failing"
	// StatePaused: an operator paused the projection; catch-up does nothing until it is resumed.
	StatePaused State = "paused"
	// StateRebuilding: Reset set the position back to the start; catch-up rebuilds the read
	// model and returns to running when it reaches the head.
	StateRebuilding State = "rebuilding"
)

// States lists every state.
func States() []State {
	return []State{StateRunning, StateFailing, StatePaused, StateRebuilding}
}

// ParseState returns the State named s, or an error matching ErrUnknownState.
func ParseState(s string) (State, error) {
	for _, st := range States() {
		if string(st) == s {
			return st, nil
		}
	}
	return "", fmt.Errorf("%w: %q; known states: %v", ErrUnknownState, s, States())
}
