package trigger_test

import (
	"errors"
	"fmt"

	"github.com/nudgeworks/nudge/trigger"
)

func ExampleDecode() {
	t, err := trigger.Decode([]byte(`{"v":1,"pos":"7414/1203","stream":"ticket-42","types":["TicketWasRegistered"],"at":"2026-11-22T10:00:00Z","reason":"append"}`))
	if err != nil {
		panic(err)
	}
	fmt.Println(t.Reason, t.Position, t.StreamID, t.Types)

	_, err = trigger.Decode([]byte(`{"v":2}`))
	fmt.Println(errors.Is(err, trigger.ErrInvalid), err)
	// Output:
	// append 7414/1203 ticket-42 [TicketWasRegistered]
	// true trigger: invalid trigger: version 2; this build reads version 1
}
