package postgres

import (
	stdsql "database/sql"
	"database/sql/driver"
	"testing"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/name"
)

func TestParseTopic(t *testing.T) {
	for _, tc := range []struct {
		topic string
		kind  topicKind
		name  string
	}{
		{channel.TriggerTopic, topicFanOut, ""},
		{projectionTopic("tickets.v2"), topicProjection, "tickets.v2"},
		{"nudge.triggers:a-b_c.d", topicProjection, "a-b_c.d"},
	} {
		kind, name, err := parseTopic(tc.topic)
		require.NoError(t, err, tc.topic)
		require.Equal(t, tc.kind, kind, tc.topic)
		require.Equal(t, tc.name, name, tc.topic)
	}
	for _, bad := range []string{"", "nudge.dead_letters", "nudge.triggers.x", "nudge.triggers:", "nudge.triggers:Bad", "nudge.triggers:x:y", "watermill_x"} {
		_, _, err := parseTopic(bad)
		require.Error(t, err, bad)
	}
	_, _, err := parseTopic("nudge.triggers:Bad")
	require.ErrorIs(t, err, name.ErrInvalid)
	_, _, err = parseTopic("other")
	require.ErrorIs(t, err, ErrUnknownTopic)
}

// TestSelectTakesNoRowLocks: the subscription's SELECT is the queue schema's without FOR UPDATE,
// on the shared table, filtered by projection as a parameter, at READ COMMITTED.
func TestSelectTakesNoRowLocks(t *testing.T) {
	s := newSchemaAdapter(newTables("nudge_ch"), 10, false)
	q, err := s.SelectQuery(wmsql.SelectQueryParams{Topic: projectionTopic("tickets")})
	require.NoError(t, err)
	require.NotContains(t, q.Query, "FOR UPDATE")
	require.Contains(t, q.Query, `FROM "nudge_ch"."nudge_channel_triggers"`)
	require.Contains(t, q.Query, "AND projection = $1")
	require.Contains(t, q.Query, "LIMIT 10")
	require.Equal(t, []any{pgx.QueryExecModeSimpleProtocol, "tickets"}, q.Args, "simple protocol: no portal keeps a snapshot after the SELECT")
	require.Equal(t, stdsql.LevelReadCommitted, s.SubscribeIsolationLevel())

	_, err = s.SelectQuery(wmsql.SelectQueryParams{Topic: channel.TriggerTopic})
	require.ErrorContains(t, err, "publish-only")

	locking := newSchemaAdapter(newTables(""), 10, true)
	q, err = locking.SelectQuery(wmsql.SelectQueryParams{Topic: projectionTopic("tickets")})
	require.NoError(t, err)
	require.Contains(t, q.Query, "FOR UPDATE")
}

func TestInsertQueries(t *testing.T) {
	s := newSchemaAdapter(newTables(""), 10, false)
	msgs := message.Messages{message.NewMessage("a", []byte("x")), message.NewMessage("b", nil)}
	msgs[0].Metadata.Set("k", "v")

	fanOut, err := s.InsertQuery(wmsql.InsertQueryParams{Topic: channel.TriggerTopic, Msgs: msgs})
	require.NoError(t, err)
	require.Contains(t, fanOut.Query, `CROSS JOIN "nudge_channel_subscriptions"`)
	require.Equal(t, []any{[]string{"a", "b"}, [][]byte{[]byte("x"), nil}, []string{`{"k":"v"}`, `{}`}}, fanOut.Args)

	one, err := s.InsertQuery(wmsql.InsertQueryParams{Topic: projectionTopic("tickets"), Msgs: msgs})
	require.NoError(t, err)
	require.Contains(t, one.Query, "s.projection = $4")
	require.Equal(t, "tickets", one.Args[3])

	_, err = s.InsertQuery(wmsql.InsertQueryParams{Topic: "elsewhere", Msgs: msgs})
	require.ErrorIs(t, err, ErrUnknownTopic)
}

// TestAckDeletesOnlyAckedRows: watermill-sql v4.0.0 passes every row of a batch to the ack
// query even when it stopped at an unacked one; only rows up to the last acked are deleted.
func TestAckDeletesOnlyAckedRows(t *testing.T) {
	a := newOffsetsAdapter(newTables(""))
	rows := []wmsql.Row{{Offset: 4}, {Offset: 7}, {Offset: 9}}
	q, err := a.AckMessageQuery(wmsql.AckMessageQueryParams{Topic: projectionTopic("tickets"), LastRow: rows[1], Rows: rows})
	require.NoError(t, err)
	require.Contains(t, q.Query, `DELETE FROM "nudge_channel_triggers"`)
	offsets, err := q.Args[0].(driver.Valuer).Value()
	require.NoError(t, err)
	require.Equal(t, "{4,7}", offsets)
}
