package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/backoff"
	"github.com/nudgeworks/nudge/internal/eventload"
	"github.com/nudgeworks/nudge/internal/redact"
	"github.com/nudgeworks/nudge/postgres"
	pgproj "github.com/nudgeworks/nudge/projection/postgres"
)

// Names of what the harness creates on the servers. They follow internal/pgtest's and
// internal/amqptest's schemes ("nudge_test_<unix seconds>_…", "nudge_test.<unix seconds>.…"),
// so leftovers of a killed run are swept by the next test run as well as by the next bench run.
const (
	dbPrefix     = "nudge_test_"
	dbMarker     = "bench"
	amqpPrefix   = "nudge_test."
	staleAfter   = 2 * time.Hour
	setupTimeout = 30 * time.Second
)

// harness is what every scenario shares: the servers, the sizes and the loggers.
type harness struct {
	opts   options
	sizes  sizes
	admin  *pgxpool.Pool // on the maintenance database: creates and drops the run's databases
	runID  string        // "<unix seconds>_<random hex>", unique to the run
	log    *slog.Logger  // the harness's own progress lines
	libLog *slog.Logger  // given to the library's components (-log-level)

	mu  sync.Mutex
	seq int
	// histories are the run's template databases of loaded events, by event count
	// (historyFixture).
	histories map[int]*history
}

// newHarness connects to PostgreSQL and drops the databases that killed bench runs left.
func newHarness(ctx context.Context, opts options, log, libLog *slog.Logger) (*harness, error) {
	ctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	admin, err := pgxpool.New(ctx, opts.postgresURL)
	if err == nil {
		err = admin.Ping(ctx)
	}
	if err != nil {
		if admin != nil {
			admin.Close()
		}
		return nil, fmt.Errorf("PostgreSQL at %s is not reachable: %w; start it with `make up`, or pass -postgres", redact.URL(opts.postgresURL), err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	h := &harness{
		opts:   opts,
		sizes:  sizesFor(opts.quick),
		admin:  admin,
		runID:  strconv.FormatInt(time.Now().Unix(), 10) + "_" + dbMarker + hex.EncodeToString(b),
		log:    log,
		libLog: libLog,
	}
	if len(opts.deepEvents) > 0 {
		h.sizes.deepEvents = opts.deepEvents
	}
	h.dropStale(ctx)
	return h, nil
}

// close drops the run's template databases and releases the admin pool.
func (h *harness) close() {
	h.mu.Lock()
	histories := h.histories
	h.histories = nil
	h.mu.Unlock()
	for _, hist := range histories {
		if hist.db != nil {
			hist.db.close()
		}
	}
	h.admin.Close()
}

// next returns a number unique within the run, for names.
func (h *harness) next() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seq++
	return h.seq
}

// serverVersion returns PostgreSQL's server_version_num, 0 if unknown.
func (h *harness) serverVersion(ctx context.Context) int {
	var v int
	_ = h.admin.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&v)
	return v
}

// dropStale drops bench databases older than staleAfter: runs killed before their cleanup.
func (h *harness) dropStale(ctx context.Context) {
	rows, err := h.admin.Query(ctx, `SELECT datname FROM pg_database WHERE datname LIKE $1`, dbPrefix+"%\\_"+dbMarker+"%")
	if err != nil {
		return
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return
	}
	for _, name := range names {
		stamp, _, _ := strings.Cut(strings.TrimPrefix(name, dbPrefix), "_")
		sec, err := strconv.ParseInt(stamp, 10, 64)
		if err != nil || time.Since(time.Unix(sec, 0)) < staleAfter {
			continue
		}
		if _, err := h.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err == nil {
			h.log.InfoContext(ctx, "dropped a database a killed run left", slog.String("database", name))
		}
	}
}

// database is a PostgreSQL database that exists for one step of a scenario.
type database struct {
	h      *harness
	name   string
	url    string
	pool   *pgxpool.Pool
	pools  []*pgxpool.Pool
	closed sync.Once
}

// newDatabase creates a fresh database and opens a pool of up to maxConns connections on it.
// Close drops it.
func (h *harness) newDatabase(ctx context.Context, maxConns int32) (*database, error) {
	return h.createDatabase(ctx, maxConns, "")
}

// createDatabase creates a database, a copy of template if that is not empty, and opens a
// pool of up to maxConns connections on it. Close drops it.
func (h *harness) createDatabase(ctx context.Context, maxConns int32, template string) (*database, error) {
	name := fmt.Sprintf("%s%s_%d", dbPrefix, h.runID, h.next())
	create := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	timeout := setupTimeout
	if template != "" {
		// A copy of the template's files: PostgreSQL 15's default strategy (WAL_LOG) would
		// write the whole database to the WAL.
		create += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
		if h.serverVersion(ctx) >= 150000 {
			create += " STRATEGY FILE_COPY"
		}
		timeout = rebuildSetupDeadline
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := h.admin.Exec(cctx, create); err != nil {
		return nil, fmt.Errorf("create database %s: %w", name, err)
	}
	u, err := url.Parse(h.opts.postgresURL)
	if err != nil {
		return nil, fmt.Errorf("-postgres must be a postgres:// URL: %w", err)
	}
	u.Path = "/" + name
	db := &database{h: h, name: name, url: u.String()}
	if db.pool, err = db.newPool(ctx, maxConns); err != nil {
		db.close()
		return nil, err
	}
	return db, nil
}

// newPool opens another pool of up to maxConns connections on the database, closed by close.
func (db *database) newPool(ctx context.Context, maxConns int32) (*pgxpool.Pool, error) {
	return db.newNamedPool(ctx, maxConns, "")
}

// writersApplication is the application_name of a live run's writers' connections, which
// backendProbe counts apart.
const writersApplication = "nudge-bench-writers"

// newNamedPool is newPool with the connections' application_name set to name ("": the URL's).
func (db *database) newNamedPool(ctx context.Context, maxConns int32, name string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(db.url)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", redact.URL(db.url), err)
	}
	cfg.MaxConns = maxConns
	if name != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = name
	}
	cctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(cctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", redact.URL(db.url), err)
	}
	db.pools = append(db.pools, pool)
	return pool, nil
}

// resetPools closes the idle connections of the database's pools (those in use close when
// released); the pools open new ones on demand.
func (db *database) resetPools() {
	for _, p := range db.pools {
		p.Reset()
	}
}

// close closes the database's pools and drops it, even when the run is being interrupted. It
// may be called more than once.
func (db *database) close() { db.closed.Do(db.drop) }

func (db *database) drop() {
	for _, p := range db.pools {
		p.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if _, err := db.h.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db.name}.Sanitize()+" WITH (FORCE)"); err != nil {
		db.h.log.Error("could not drop a bench database; the next run drops it after 2 h",
			slog.String("database", db.name), slog.Any("error", err))
	}
}

// history is a template database holding a store of loaded events (historyFixture).
type history struct {
	once sync.Once
	db   *database
	last eventstore.Position // the last loaded event
	took time.Duration       // the load's time
	err  error
}

// historyFixture returns a fixture on a fresh database holding events events of the rebuild's
// layout (over sizes.rebuildStreams streams, TicketWasRegistered, ticketPayload), readable. The
// events are loaded with COPY once per run into a template database, which each call copies
// (CREATE DATABASE … TEMPLATE, a copy of its files: seconds, where the load takes half a
// minute): the rebuild and the blue/green build share one load. Each copy is as the load and a
// vacuum left it, with no table of a projection.
func (h *harness) historyFixture(ctx context.Context, maxConns int32, events int) (*fixture, error) {
	h.mu.Lock()
	if h.histories == nil {
		h.histories = map[int]*history{}
	}
	hist := h.histories[events]
	if hist == nil {
		hist = &history{}
		h.histories[events] = hist
	}
	h.mu.Unlock()
	hist.once.Do(func() { hist.db, hist.last, hist.took, hist.err = h.loadHistory(ctx, events) })
	if hist.err != nil {
		return nil, hist.err
	}
	started := time.Now()
	db, err := h.createDatabase(ctx, maxConns, hist.db.name)
	if err != nil {
		return nil, err
	}
	f := &fixture{db: db}
	if err := f.init(ctx); err != nil {
		db.close()
		return nil, err
	}
	if err := f.waitReadable(ctx, hist.last, rebuildSetupDeadline); err != nil {
		f.close()
		return nil, err
	}
	h.log.InfoContext(ctx, "events copied from the run's loaded history", slog.Int("events", events),
		slog.Duration("took", time.Since(started).Round(time.Millisecond)), slog.Duration("load_took", hist.took.Round(time.Millisecond)))
	return f, nil
}

// loadHistory creates a template database and loads events events into its store with COPY.
// It closes its pools: a template is copied only while no one is connected to it.
func (h *harness) loadHistory(ctx context.Context, events int) (*database, eventstore.Position, time.Duration, error) {
	started := time.Now()
	f, err := h.newFixture(ctx, 4)
	if err != nil {
		return nil, eventstore.Position{}, 0, err
	}
	last, err := loadEvents(f.db.pool, events, h.sizes.rebuildStreams, rebuildEventType, ticketPayload)
	if err == nil {
		err = f.waitReadable(ctx, last, rebuildSetupDeadline)
	}
	if err == nil {
		// The vacuum autovacuum would run after the load, now: a copy's statistics start
		// empty, so autovacuum never visits the loaded rows there.
		_, err = f.db.pool.Exec(ctx, `VACUUM (ANALYZE) nudge_events, nudge_streams`)
	}
	if err != nil {
		f.close()
		return nil, eventstore.Position{}, 0, err
	}
	for _, p := range f.db.pools {
		p.Close()
	}
	f.db.pools, f.db.pool = nil, nil
	took := time.Since(started)
	h.log.InfoContext(ctx, "events loaded with COPY into the run's template database", slog.Int("events", events),
		slog.Duration("took", took.Round(time.Millisecond)))
	return f.db, last, took, nil
}

// fixture is an event store and a projection backend on a fresh database.
type fixture struct {
	db      *database
	store   *espg.Store
	backend *pgproj.Backend
	// channelPool, if set, bounds the PostgreSQL queue's pool (default: a connection per
	// projection, and 4).
	channelPool int32

	// listener wakes the fixture's relays on appends (postgres.NotifyEvents); started by the
	// first wakerFor, stopped by close.
	listenOnce sync.Once
	listener   *postgres.Listener
	listenErr  error
	stopListen func()
}

// waker returns the fixture's listener, started on first use: relays woken by appends.
func (f *fixture) waker(log *slog.Logger) (*postgres.Listener, error) {
	f.listenOnce.Do(func() {
		f.listener, f.listenErr = postgres.NewListener(postgres.PoolConnect(f.db.pool), postgres.ListenerConfig{Channel: postgres.NotifyEvents, Logger: log})
		if f.listenErr != nil {
			return
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = f.listener.Run(ctx) // nil when ctx ends
		}()
		f.stopListen = func() { cancel(); <-done }
	})
	return f.listener, f.listenErr
}

// newFixture creates a database with a pool of maxConns connections and migrates the event
// store and the projection backend in it.
func (h *harness) newFixture(ctx context.Context, maxConns int32) (*fixture, error) {
	db, err := h.newDatabase(ctx, maxConns)
	if err != nil {
		return nil, err
	}
	f := &fixture{db: db}
	if err := f.init(ctx); err != nil {
		db.close()
		return nil, err
	}
	return f, nil
}

func (f *fixture) init(ctx context.Context) error {
	var err error
	if f.store, err = espg.New(f.db.pool, espg.Config{}); err != nil {
		return err
	}
	if f.backend, err = pgproj.New(f.store); err != nil {
		return err
	}
	if err := f.store.Migrate(ctx); err != nil {
		return err
	}
	return f.backend.Migrate(ctx)
}

func (f *fixture) close() {
	if f.stopListen != nil {
		f.stopListen()
	}
	f.db.close()
}

// waitReadable waits until the store's head reaches last: loaded events are readable once no
// transaction older than them is running anywhere in the cluster.
func (f *fixture) waitReadable(ctx context.Context, last eventstore.Position, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		head, err := f.store.Head(ctx)
		if err != nil {
			return fmt.Errorf("read the store's head: %w", err)
		}
		if !head.Less(last) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the events up to %s were not readable within %s (head %s): a long transaction elsewhere in the cluster holds readers back", last, timeout, head)
		}
		if err := backoff.Sleep(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
}

// count returns the number of rows of table and the sum of its version column.
func (f *fixture) count(ctx context.Context, table string) (rows, versions int64, err error) {
	err = f.db.pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(version), 0) FROM `+pgx.Identifier{table}.Sanitize()).Scan(&rows, &versions)
	return rows, versions, err
}

// loadEvents fills the store with COPY through internal/eventload. eventload reports failures
// through a testing.TB, as its benchmarks and tests need; failTB turns them into an error here.
func loadEvents(pool *pgxpool.Pool, events, streams int, eventType string, payload func(stream string, i int) string) (eventstore.Position, error) {
	return loadEventsOfTypes(pool, events, streams, func(int) string { return eventType }, payload)
}

// loadEventsOfTypes is loadEvents with the type of event i given by typeOf(i).
func loadEventsOfTypes(pool *pgxpool.Pool, events, streams int, typeOf func(i int) string, payload func(stream string, i int) string) (last eventstore.Position, err error) {
	tb := &failTB{}
	defer func() {
		if r := recover(); r != nil {
			if r != errFailNow { //nolint:errorlint // the sentinel itself is the panic value
				panic(r)
			}
			err = fmt.Errorf("load events with COPY: %s", strings.Join(tb.msgs, "; "))
		}
	}()
	return eventload.LoadTyped(tb, pool, events, streams, typeOf, payload), nil
}

// errFailNow is the panic with which failTB.FailNow leaves eventload.Load.
var errFailNow = errors.New("eventload failed")

// failTB is the part of testing.TB that eventload.Load and testify's require use, outside a
// test: messages are collected and FailNow panics with errFailNow, which loadEvents recovers.
// Methods of testing.TB that it does not implement panic (nil embedded interface).
type failTB struct {
	testing.TB
	msgs   []string
	failed bool
}

func (t *failTB) Helper()                           {}
func (t *failTB) Name() string                      { return "bench" }
func (t *failTB) Log(args ...any)                   {}
func (t *failTB) Logf(format string, args ...any)   {}
func (t *failTB) Error(args ...any)                 { t.fail(fmt.Sprint(args...)) }
func (t *failTB) Errorf(format string, args ...any) { t.fail(fmt.Sprintf(format, args...)) }
func (t *failTB) Fatal(args ...any)                 { t.fail(fmt.Sprint(args...)); t.FailNow() }
func (t *failTB) Fatalf(format string, args ...any) {
	t.fail(fmt.Sprintf(format, args...))
	t.FailNow()
}
func (t *failTB) Fail()           { t.failed = true }
func (t *failTB) Failed() bool    { return t.failed }
func (t *failTB) FailNow()        { t.failed = true; panic(errFailNow) }
func (t *failTB) fail(msg string) { t.failed = true; t.msgs = append(t.msgs, strings.TrimSpace(msg)) }

// amqpEnv is a run's corner of the RabbitMQ broker: a unique name prefix.
type amqpEnv struct {
	url            string
	prefix         string
	connectionName string
}

// newAMQP returns a fresh prefix for one step of a scenario.
func (h *harness) newAMQP() amqpEnv {
	prefix := fmt.Sprintf("%s%s.%d.", amqpPrefix, strings.ReplaceAll(h.runID, "_", "."), h.next())
	return amqpEnv{url: h.opts.amqpURL, prefix: prefix, connectionName: prefix + "bench"}
}

// cleanup deletes the exchange and queues a channel with the env's prefix declared for
// projections (channel/amqp's names: queue <prefix>nudge.triggers_<name> on exchange
// <prefix>nudge.triggers).
func (e amqpEnv) cleanup(projections []string) error {
	conn, err := dialAMQP(e.url, e.prefix+"cleanup")
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	queues := make([]string, 0, len(projections))
	for _, p := range projections {
		queues = append(queues, e.prefix+channel.TriggerTopic+"_"+p)
	}
	var errs []error
	for _, q := range queues {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			errs = append(errs, fmt.Errorf("delete queue %s: %w", q, err))
			if ch, err = conn.Channel(); err != nil { // a failed delete closes the channel
				return errors.Join(append(errs, err)...)
			}
		}
	}
	if err := ch.ExchangeDelete(e.prefix+channel.TriggerTopic, false, false); err != nil {
		errs = append(errs, fmt.Errorf("delete exchange: %w", err))
	}
	return errors.Join(errs...)
}

// dialAMQP opens a named connection with a short timeout.
func dialAMQP(rawURL, name string) (*amqp091.Connection, error) {
	props := amqp091.NewConnectionProperties()
	props.SetClientConnectionName(name)
	conn, err := amqp091.DialConfig(rawURL, amqp091.Config{Properties: props, Dial: amqp091.DefaultDial(5 * time.Second)})
	if err != nil {
		return nil, fmt.Errorf("RabbitMQ at %s is not reachable: %s; start it with `make up`, or pass -amqp", redact.URL(rawURL), redact.Message(err.Error(), rawURL))
	}
	return conn, nil
}

// waitUntil polls cond every interval until it is true, ctx ends or timeout passes; what
// describes the condition in the error.
func waitUntil(ctx context.Context, timeout, interval time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("wait until %s: %w", what, err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not happen within %s", what, timeout)
		}
		if err := backoff.Sleep(ctx, interval); err != nil {
			return err
		}
	}
}
