package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/nudgeworks/nudge"
	"github.com/nudgeworks/nudge/eventstore"
)

// Limits of what the API accepts, in characters.
const (
	// MaxTitleLength is the longest title the API accepts. ticket_list's title column holds
	// only Config.TitleWidth characters (100 by default): the poison of README.md.
	MaxTitleLength = 200
	// MaxCustomerLength is the longest customer name the API accepts.
	MaxCustomerLength = 100
	// MaxReasonLength is the longest closing reason the API accepts.
	MaxReasonLength = 500
)

// closeAttempts is how often closeTicket decides again when another append to the ticket's
// stream got in between its read and its append.
const closeAttempts = 3

// Errors of the ticket commands, for errors.Is.
var (
	// ErrTicketNotFound: no ticket has this id.
	ErrTicketNotFound = errors.New("ticket not found")
	// ErrAlreadyClosed: the ticket is closed already.
	ErrAlreadyClosed = errors.New("ticket is already closed")
	// ErrInvalidInput matches every *InputError.
	ErrInvalidInput = errors.New("invalid input")
	// ErrBrokerUnavailable is returned by an action that publishes triggers (a replay) when the
	// broker cannot be reached.
	ErrBrokerUnavailable = errors.New("the trigger channel's broker is unavailable")
)

// InputError is a refused field of a command. It matches ErrInvalidInput.
type InputError struct {
	// Field is the JSON name of the field.
	Field string
	// Reason says what is wrong and what is expected.
	Reason string
}

func (e *InputError) Error() string { return e.Field + ": " + e.Reason }

// Is makes errors.Is(err, ErrInvalidInput) true.
func (e *InputError) Is(target error) bool { return target == ErrInvalidInput }

// tickets runs the commands: it decides from the ticket's stream and appends events through
// the client, which has their triggers published.
type tickets struct {
	client *nudge.Client
}

// register opens a ticket and returns its id.
func (t *tickets) register(ctx context.Context, title, customer string) (string, error) {
	title, customer = strings.TrimSpace(title), strings.TrimSpace(customer)
	if err := checkText("title", title, MaxTitleLength); err != nil {
		return "", err
	}
	if err := checkText("customer", customer, MaxCustomerLength); err != nil {
		return "", err
	}
	id, err := uuid.NewV7()
	if err != nil {
		return "", fmt.Errorf("new ticket id: %w", err)
	}
	data, err := eventstore.NewEventData(TypeTicketRegistered, TicketRegistered{ID: id.String(), Title: title, Customer: customer})
	if err != nil {
		return "", err
	}
	if _, err := t.client.Append(ctx, streamID(id.String()), eventstore.NoStream, data); err != nil {
		return "", fmt.Errorf("register ticket: %w", err)
	}
	return id.String(), nil
}

// closeTicket closes ticket id. The decision ("is it open?") is read from the ticket's stream
// and the append expects exactly the version it was read at: if anything was appended in
// between (a concurrent close), the append fails with eventstore.ErrWrongExpectedVersion and
// the decision is made again on the new stream.
func (t *tickets) closeTicket(ctx context.Context, id, reason string) error {
	if _, err := uuid.Parse(id); err != nil {
		return fmt.Errorf("%w: %q is not a ticket id", ErrTicketNotFound, id)
	}
	reason = strings.TrimSpace(reason)
	if err := checkText("reason", reason, MaxReasonLength); err != nil {
		return err
	}
	data, err := eventstore.NewEventData(TypeTicketClosed, TicketClosed{ID: id, Reason: reason})
	if err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		events, err := t.client.Store().ReadStream(ctx, streamID(id), 0, 0)
		if err != nil {
			return fmt.Errorf("close ticket: read its stream: %w", err)
		}
		if len(events) == 0 {
			return fmt.Errorf("%w: %s", ErrTicketNotFound, id)
		}
		for _, e := range events {
			if e.Type == TypeTicketClosed {
				return fmt.Errorf("%w: %s was closed at %s", ErrAlreadyClosed, id, e.RecordedAt.UTC().Format("2006-01-02T15:04:05Z"))
			}
		}
		version := events[len(events)-1].StreamVersion
		_, err = t.client.Append(ctx, streamID(id), eventstore.Exact(version), data)
		if errors.Is(err, eventstore.ErrWrongExpectedVersion) && attempt < closeAttempts {
			continue // the stream moved on since we read it: decide again
		}
		if err != nil {
			return fmt.Errorf("close ticket: %w", err)
		}
		return nil
	}
}

// checkText checks a required text field's length in characters.
func checkText(field, value string, maxLen int) error {
	n := utf8.RuneCountInString(value)
	switch {
	case n == 0:
		return &InputError{Field: field, Reason: "is required and must not be blank"}
	case n > maxLen:
		return &InputError{Field: field, Reason: fmt.Sprintf("is %d characters long; at most %d allowed", n, maxLen)}
	}
	return nil
}
