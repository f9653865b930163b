package name_test

import (
	"errors"
	"fmt"

	"github.com/nudgeworks/nudge/name"
)

func ExampleValidate() {
	fmt.Println(name.Validate("ticket_list"))
	err := name.Validate("Ticket List")
	fmt.Println(errors.Is(err, name.ErrInvalid), err)
	// Output:
	// <nil>
	// true projection: invalid name "Ticket List": use lowercase letters, digits, '_', '-' and '.', starting with a letter or digit
}
