package amqp

import (
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
)

// marshaler is watermill-amqp's DefaultMarshaler, except that it takes headers of any type.
//
// DefaultMarshaler (v2.1.3) refuses a delivery with a header that is not a string, and its
// subscriber nacks the delivery with requeue: the message comes back at once, for ever, and
// never reaches the handler, so it is neither projected nor dead-lettered. RabbitMQ sets such a
// header itself — a quorum queue's redelivery carries x-delivery-count, an integer — and other
// publishers may too. marshaler passes every header on as its string form instead.
type marshaler struct {
	amqp.DefaultMarshaler
}

// metadataRouting is the metadata key of a published message's partition routing keys
// (routingKeys), comma-separated: Marshal moves them into the CC header.
const metadataRouting = "nudge_routing"

// headerCC is RabbitMQ's sender-selected distribution header: more routing keys.
const headerCC = "CC"

// joinRouting joins routing keys for metadataRouting.
func joinRouting(keys []any) string {
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k.(string)
	}
	return strings.Join(parts, ",")
}

// Marshal implements amqp.Marshaler: as DefaultMarshaler, with the routing keys of
// metadataRouting in the CC header instead.
func (m marshaler) Marshal(msg *message.Message) (amqp091.Publishing, error) {
	pub, err := m.DefaultMarshaler.Marshal(msg)
	if err != nil {
		return pub, err
	}
	if keys, ok := pub.Headers[metadataRouting].(string); ok {
		delete(pub.Headers, metadataRouting)
		var cc []any
		for k := range strings.SplitSeq(keys, ",") {
			cc = append(cc, k)
		}
		pub.Headers[headerCC] = cc
	}
	return pub, nil
}

// Unmarshal implements amqp.Marshaler. It drops the CC header: routing, not the message's.
func (m marshaler) Unmarshal(d amqp091.Delivery) (*message.Message, error) {
	if _, ok := d.Headers[headerCC]; ok {
		headers := make(amqp091.Table, len(d.Headers))
		for key, value := range d.Headers {
			if key != headerCC {
				headers[key] = value
			}
		}
		d.Headers = headers
	}
	if !allStrings(d.Headers) {
		headers := make(amqp091.Table, len(d.Headers))
		for key, value := range d.Headers {
			headers[key] = headerString(value)
		}
		d.Headers = headers
	}
	return m.DefaultMarshaler.Unmarshal(d)
}

// allStrings reports whether every value of headers is a string.
func allStrings(headers amqp091.Table) bool {
	for _, value := range headers {
		if _, ok := value.(string); !ok {
			return false
		}
	}
	return true
}

// headerString is a header value as text: strings and byte arrays as they are, anything else
// as fmt prints it.
func headerString(value any) string {
	switch v := value.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	default:
		return fmt.Sprint(v)
	}
}
