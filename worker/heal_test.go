package worker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	amqpchannel "github.com/nudgeworks/nudge/channel/amqp"
	"github.com/nudgeworks/nudge/deadletter"
	dlpg "github.com/nudgeworks/nudge/deadletter/postgres"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/projectiontest"
	"github.com/nudgeworks/nudge/retry"
	"github.com/nudgeworks/nudge/worker"
)

// lockTimeoutModel is s.model whose writes give up after lock_timeout, as a service that sets
// lock_timeout does: a lock held on its table makes it fail with a transient error.
func (s *setup) lockTimeoutModel(t testing.TB, name string) *projection.Projection {
	t.Helper()
	table := pgx.Identifier{name + "_model"}.Sanitize()
	p, err := projection.New(name, projection.Config{
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (n int PRIMARY KEY, times int NOT NULL)`)
			return err
		},
	}, projection.On("A", func(ctx context.Context, tx pgx.Tx, e projection.Event[projectiontest.Payload]) error {
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '50ms'`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1, 1) ON CONFLICT (n) DO UPDATE SET times = `+table+`.times + 1`, e.Data.N)
		return err
	}))
	require.NoError(t, err)
	return p
}

// TestTransientFailureHeals: a lock held on alpha's read-model table makes alpha fail on
// event 2 with a lock timeout (a real transient failure) until its retries run out and the
// trigger is dead-lettered. Once the lock is released alpha passes the event at its next
// trigger, and the worker resolves that dead letter as healed, with the position passed, so the
// next start does not replay it. The dead letters it has not passed stay failed: beta's (beta
// fails on event 2 for good) and an invalid trigger's (no failing event).
func TestTransientFailureHeals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newSetup(t)
	ch := s.newChannel(t, channels["amqp"])
	dead, err := dlpg.New(s.db.Pool, dlpg.Config{})
	require.NoError(t, err)
	require.NoError(t, dead.Migrate(ctx))
	beta := s.model(t, "beta", func(n int) error {
		if n == 2 {
			return errors.New("beta cannot project event 2")
		}
		return nil
	})
	w := s.start(t, ch, worker.Config{
		SafetyNetInterval: -1,
		Retry:             retry.Policy{MaxAttempts: 2, InitialInterval: 10 * time.Millisecond, MaxInterval: 20 * time.Millisecond},
		DeadLetters:       dead,
	}, s.lockTimeoutModel(t, "alpha"), beta)

	s.append(t, "s", storeEvent(1))
	require.Eventually(t, func() bool { return s.has(t, "alpha", 1) }, eventually, 5*time.Millisecond)

	locker, err := s.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = locker.Rollback(ctx) }()
	_, err = locker.Exec(ctx, `LOCK TABLE alpha_model IN EXCLUSIVE MODE`)
	require.NoError(t, err)

	s.append(t, "s", storeEvent(2))
	alphaRec := awaitRecord(t, dead, "alpha")
	require.NotNil(t, alphaRec.FailingEvent)
	require.Contains(t, alphaRec.Error, "lock timeout")
	require.Equal(t, "sqlstate 55P03", alphaRec.Metadata[deadletter.MetadataTransient], "marked as a transient failure")
	betaRec := awaitRecord(t, dead, "beta")

	garbage := message.NewMessage(watermill.NewUUID(), []byte("not a trigger"))
	garbage.SetContext(ctx)
	require.NoError(t, ch.Publisher().Publish(ch.(*amqpchannel.Channel).QueueName("alpha"), garbage))
	var invalid deadletter.Record
	require.Eventually(t, func() bool {
		recs, err := dead.List(ctx, deadletter.Filter{Projection: "alpha"})
		require.NoError(t, err)
		for _, r := range recs {
			if r.FailingEvent == nil {
				invalid = r
				return true
			}
		}
		return false
	}, eventually, 5*time.Millisecond, "the invalid trigger is dead-lettered")

	require.NoError(t, locker.Rollback(ctx)) // the transient cause goes away
	require.Equal(t, deadletter.StatusFailed, get(t, dead, alphaRec.ID).Status, "nothing heals before alpha passes the event")
	s.append(t, "s", storeEvent(3))
	require.Eventually(t, func() bool { rows, _ := s.count(t, "alpha"); return rows == 3 }, eventually, 5*time.Millisecond)
	var healed deadletter.Record
	require.Eventually(t, func() bool { healed = get(t, dead, alphaRec.ID); return healed.Healed() }, eventually, 5*time.Millisecond,
		"alpha passed the event: its dead letter is resolved as healed")
	require.Equal(t, deadletter.StatusResolved, healed.Status)
	require.Equal(t, deadletter.HealedBy, healed.ResolvedBy)
	require.Contains(t, healed.ResolveNote, "healed: projection passed position ")
	require.False(t, healed.ResolvedAt.IsZero())
	// The healer counts the heal once the store has it resolved: await the count.
	require.Eventually(t, func() bool { return w.Stats("alpha").Healed == 1 }, eventually, 5*time.Millisecond, "alpha's healed count")

	require.Equal(t, deadletter.StatusFailed, get(t, dead, invalid.ID).Status, "an invalid trigger has no event to pass")
	require.Equal(t, deadletter.StatusFailed, get(t, dead, betaRec.ID).Status, "beta has not passed its event")
	require.Zero(t, w.Stats("beta").Healed)
	_, wrong := s.count(t, "alpha")
	require.Zero(t, wrong)
}

// awaitRecord waits for the projection's first dead letter and returns it.
func awaitRecord(t *testing.T, dead deadletter.Store, name string) deadletter.Record {
	t.Helper()
	var rec deadletter.Record
	require.Eventually(t, func() bool {
		recs, err := dead.List(context.Background(), deadletter.Filter{Projection: name})
		require.NoError(t, err)
		if len(recs) == 0 {
			return false
		}
		rec = recs[0]
		return true
	}, eventually, 5*time.Millisecond, "%s's trigger is dead-lettered", name)
	return rec
}

// get reads a dead letter.
func get(t *testing.T, dead deadletter.Store, id int64) deadletter.Record {
	t.Helper()
	rec, err := dead.Get(context.Background(), id)
	require.NoError(t, err)
	return rec
}
