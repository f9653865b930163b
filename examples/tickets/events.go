package main

// Event types of the ticket streams, as stored in the event store.
const (
	TypeTicketRegistered = "TicketRegistered"
	TypeTicketClosed     = "TicketClosed"
)

// TicketRegistered records that a customer opened a ticket. It is the first event of the
// stream "ticket-<id>".
type TicketRegistered struct {
	ID       string `json:"id"`
	Title    string `json:"title"`
	Customer string `json:"customer"`
}

// TicketClosed records that a ticket was closed, and why. It is the last event of its stream.
type TicketClosed struct {
	ID     string `json:"id"`
	Reason string `json:"reason"`
}

// streamID is the event stream of ticket id.
func streamID(id string) string { return "ticket-" + id }
