package postgres

import (
	stdsql "database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/name"
)

// Topics. Watermill topic names allow [A-Za-z0-9-$:._]; projection names (lowercase letters,
// digits, '_', '-', '.') never contain ':', so "nudge.triggers:<projection>" is unambiguous.
const (
	// topicSeparator joins channel.TriggerTopic and a projection name.
	topicSeparator = ":"
)

// projectionTopic is the topic of one projection's subscription. Publishing to it addresses
// that projection only.
func projectionTopic(name string) string { return channel.TriggerTopic + topicSeparator + name }

// topicKind says which table a topic maps to and how.
type topicKind int

const (
	// topicFanOut is channel.TriggerTopic: publishing inserts one row per declared projection.
	topicFanOut topicKind = iota + 1
	// topicProjection is projectionTopic(name): one projection's rows.
	topicProjection
)

// ErrUnknownTopic matches a publish or subscription on a topic this channel does not have.
var ErrUnknownTopic = errors.New("postgres channel: unknown topic")

// parseTopic maps a Watermill topic to its kind and, for a projection's topic, the projection.
// Nothing reaches SQL that parseTopic has not accepted; projection names reach it only as
// query parameters.
func parseTopic(topic string) (topicKind, string, error) {
	if topic == channel.TriggerTopic {
		return topicFanOut, "", nil
	}
	if projection, ok := strings.CutPrefix(topic, channel.TriggerTopic+topicSeparator); ok {
		if err := name.Validate(projection); err != nil {
			return 0, "", fmt.Errorf("postgres channel: topic %q: %w", topic, err)
		}
		return topicProjection, projection, nil
	}
	return 0, "", fmt.Errorf("%w %q: use %q (every declared projection) or %q (one projection; Channel.Subscriber returns it)",
		ErrUnknownTopic, topic, channel.TriggerTopic, projectionTopic("<projection>"))
}

// tables are the channel's table names, qualified by the configured schema and quoted.
type tables struct {
	subscriptions, triggers string
}

func newTables(schema string) tables {
	name := func(table string) string {
		if schema == "" {
			return pgx.Identifier{table}.Sanitize()
		}
		return pgx.Identifier{schema, table}.Sanitize()
	}
	return tables{
		subscriptions: name("nudge_channel_subscriptions"),
		triggers:      name("nudge_channel_triggers"),
	}
}

// schemaAdapter is watermill-sql's PostgreSQLQueueSchema over the channel's shared tables, with
// four changes:
//
//   - InsertQuery fans a trigger out in one statement (INSERT … SELECT from the registry of
//     declared projections), or inserts one projection's row.
//   - SelectQuery drops the queue schema's FOR UPDATE, so the subscriber's transaction takes
//     no transaction id while the handler runs (see the package documentation).
//   - Subscriptions run at READ COMMITTED, so acking rows another consumer of the same
//     projection already deleted affects nothing instead of failing the ack with a
//     serialization error (the queue schema asks for REPEATABLE READ).
//   - The SELECT runs over pgx's simple protocol, so no portal keeps its snapshot (and holds
//     back VACUUM) while the handler runs.
type schemaAdapter struct {
	queue    wmsql.PostgreSQLQueueSchema
	tables   tables
	lockRows bool // only for the measurement that shows why the row locks go

	insertFanOut, insertOne string
}

var _ wmsql.SchemaAdapter = (*schemaAdapter)(nil)

// messageRows unnests the published messages, in order: $1 ids, $2 payloads, $3 metadata.
const messageRows = `unnest($1::text[], $2::bytea[], $3::text[]) WITH ORDINALITY AS m(uuid, payload, metadata, ord)`

func newSchemaAdapter(tabs tables, batchSize int, lockRows bool) *schemaAdapter {
	return &schemaAdapter{
		queue: wmsql.PostgreSQLQueueSchema{
			GenerateMessagesTableName: func(string) string { return tabs.triggers },
			GenerateWhereClause: func(p wmsql.GenerateWhereClauseParams) (string, []any) {
				if _, name, _ := parseTopic(p.Topic); name != "" {
					return "projection = $1", []any{name}
				}
				return "", nil
			},
			GeneratePayloadType: func(string) string { return "BYTEA" },
			SubscribeBatchSize:  batchSize,
		},
		tables:   tabs,
		lockRows: lockRows,
		insertFanOut: `INSERT INTO ` + tabs.triggers + ` (projection, uuid, payload, metadata)
			SELECT s.projection, m.uuid, m.payload, m.metadata::json
			FROM ` + messageRows + ` CROSS JOIN ` + tabs.subscriptions + ` s
			ORDER BY m.ord, s.projection`,
		insertOne: `INSERT INTO ` + tabs.triggers + ` (projection, uuid, payload, metadata)
			SELECT s.projection, m.uuid, m.payload, m.metadata::json
			FROM ` + messageRows + ` JOIN ` + tabs.subscriptions + ` s ON s.projection = $4
			ORDER BY m.ord`,
	}
}

// InsertQuery implements wmsql.SchemaAdapter.
func (s *schemaAdapter) InsertQuery(p wmsql.InsertQueryParams) (wmsql.Query, error) {
	kind, name, err := parseTopic(p.Topic)
	if err != nil {
		return wmsql.Query{}, err
	}
	ids := make([]string, len(p.Msgs))
	payloads := make([][]byte, len(p.Msgs))
	metadata := make([]string, len(p.Msgs))
	for i, msg := range p.Msgs {
		md, err := json.Marshal(msg.Metadata)
		if err != nil {
			return wmsql.Query{}, fmt.Errorf("postgres channel: encode metadata of message %s: %w", msg.UUID, err)
		}
		ids[i], payloads[i], metadata[i] = msg.UUID, msg.Payload, string(md)
	}
	if kind == topicFanOut {
		return wmsql.Query{Query: s.insertFanOut, Args: []any{ids, payloads, metadata}}, nil
	}
	return wmsql.Query{Query: s.insertOne, Args: []any{ids, payloads, metadata, name}}, nil
}

// errLockedSelectChanged says that watermill-sql's queue SELECT no longer has the shape this
// adapter rewrites; the upgrade needs a look before the channel can be used.
var errLockedSelectChanged = errors.New("postgres channel: watermill-sql's PostgreSQLQueueSchema SELECT no longer ends with FOR UPDATE; " +
	"review channel/postgres's schemaAdapter for this watermill-sql version")

// SelectQuery implements wmsql.SchemaAdapter: the queue schema's SELECT without FOR UPDATE.
func (s *schemaAdapter) SelectQuery(p wmsql.SelectQueryParams) (wmsql.Query, error) {
	kind, _, err := parseTopic(p.Topic)
	if err != nil {
		return wmsql.Query{}, err
	}
	if kind == topicFanOut {
		return wmsql.Query{}, fmt.Errorf("postgres channel: %q is the publish-only fan-out topic; subscribe to a projection's topic (Channel.Subscriber returns it)", p.Topic)
	}
	q, err := s.queue.SelectQuery(p)
	if err != nil {
		return wmsql.Query{}, err
	}
	unlocked, ok := strings.CutSuffix(strings.TrimRight(q.Query, " \t\n"), "FOR UPDATE")
	if !ok {
		return wmsql.Query{}, errLockedSelectChanged
	}
	if !s.lockRows {
		q.Query = unlocked
	}
	// pgx's simple protocol (a QueryExecMode as the first argument): with the extended
	// protocol the finished SELECT's unnamed portal, and its snapshot, would live until the
	// transaction's next statement, so the idle transaction would hold back VACUUM while the
	// handler runs. The simple protocol drops the portal when the SELECT ends.
	q.Args = append([]any{pgx.QueryExecModeSimpleProtocol}, q.Args...)
	return q, nil
}

// UnmarshalMessage implements wmsql.SchemaAdapter.
func (s *schemaAdapter) UnmarshalMessage(p wmsql.UnmarshalMessageParams) (wmsql.Row, error) {
	return s.queue.UnmarshalMessage(p)
}

// SchemaInitializingQueries implements wmsql.SchemaAdapter. The tables come from the
// channel's migrations (Declare, Migrate), never from Watermill.
func (s *schemaAdapter) SchemaInitializingQueries(wmsql.SchemaInitializingQueriesParams) ([]wmsql.Query, error) {
	return nil, nil
}

// SubscribeIsolationLevel implements wmsql.SchemaAdapter.
func (s *schemaAdapter) SubscribeIsolationLevel() stdsql.IsolationLevel {
	return stdsql.LevelReadCommitted
}

// offsetsAdapter is watermill-sql's PostgreSQLQueueOffsetsAdapter{DeleteOnAck: true} with one
// fix: it deletes only the rows the subscriber delivered and saw acked.
//
// watermill-sql v4.0.0's subscriber stops a batch at the first message that is not acked (its
// AckDeadline passed, or the subscriber is closing) and then runs the ack query with every row
// of the batch, acked or not, so the unacked rest of the batch would be deleted undelivered.
// Rows are delivered in offset order, so the acked ones are those up to the last acked row.
type offsetsAdapter struct {
	wmsql.PostgreSQLQueueOffsetsAdapter
}

var _ wmsql.OffsetsAdapter = offsetsAdapter{}

func newOffsetsAdapter(tabs tables) offsetsAdapter {
	return offsetsAdapter{wmsql.PostgreSQLQueueOffsetsAdapter{
		DeleteOnAck:               true,
		GenerateMessagesTableName: func(string) string { return tabs.triggers },
	}}
}

// AckMessageQuery implements wmsql.OffsetsAdapter.
func (a offsetsAdapter) AckMessageQuery(p wmsql.AckMessageQueryParams) (wmsql.Query, error) {
	if _, _, err := parseTopic(p.Topic); err != nil {
		return wmsql.Query{}, err
	}
	acked := make([]wmsql.Row, 0, len(p.Rows))
	for _, row := range p.Rows {
		if row.Offset <= p.LastRow.Offset {
			acked = append(acked, row)
		}
	}
	p.Rows = acked
	return a.PostgreSQLQueueOffsetsAdapter.AckMessageQuery(p)
}
