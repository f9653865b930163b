package postgres_test

import (
	"errors"
	"fmt"

	"github.com/nudgeworks/nudge/postgres"
)

func ExampleValidateSchema() {
	for _, schema := range []string{"", "nudge_ops", "Nudge"} {
		err := postgres.ValidateSchema(schema)
		fmt.Printf("%q: %v\n", schema, errors.Is(err, postgres.ErrInvalidSchema))
	}
	// Output:
	// "": false
	// "nudge_ops": false
	// "Nudge": true
}

func ExampleComponents() {
	// The order postgres.Migrate runs them in, dependencies first.
	fmt.Println(postgres.Components())
	// Output:
	// [eventstore projection deadletter channel]
}
