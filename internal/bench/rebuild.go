package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection"
)

// The rebuild targets; the per-event ones apply to each per-event mode.
var (
	targetPerEvent      = Target{Name: "rebuild", Op: AtLeast, Threshold: 50_000, Unit: "events/s"}
	targetPerEventNaive = Target{Name: "rebuild vs the naive loop", Op: AtLeast, Threshold: 30, Unit: "×"}
	targetSetBased      = Target{Name: "rebuild, set-based flush", Op: AtLeast, Threshold: 90_000, Unit: "events/s"}
	targetPeakRSS       = Target{Name: "rebuild, peak RSS", Op: AtMost, Threshold: 100, Unit: "MB"}
	targetRSSGrowth     = Target{Name: "rebuild, RSS growth from 25% to 100% of the events (flat)", Op: AtMost, Threshold: 10, Unit: "MB"}
)

// rebuildTargets lists every target the rebuild checks.
func rebuildTargets() []Target {
	var ts []Target
	for _, mode := range rebuildModes[:2] {
		ts = append(ts, targetPerEvent.about(mode.label), targetPerEventNaive.about(mode.label))
	}
	for _, mode := range rebuildModes[2:] {
		ts = append(ts, targetSetBased.about(mode.label))
	}
	return append(ts, targetPeakRSS, targetRSSGrowth)
}

const (
	// rebuildEventType is the type of the rebuild's (and most scenarios') events.
	rebuildEventType = "TicketWasRegistered"
	// rebuildSetupDeadline bounds the wait for loaded events to become readable.
	rebuildSetupDeadline = 2 * time.Minute
)

// ticketRegistered is the payload of the rebuild's events.
type ticketRegistered struct {
	TicketID string  `json:"ticket_id"`
	Customer string  `json:"customer"`
	Price    float64 `json:"price"`
}

// ticketPayload is event i's JSON payload, about 200 bytes.
func ticketPayload(ticket string, i int) string {
	return fmt.Sprintf(`{"ticket_id":%q,"customer":"customer-%06d","price":%d.%d,"currency":"EUR",`+
		`"event":"Spring concert, hall B","seat":"row %d seat %d","channel":"web","registered_at":"2024-03-14T09:26:53Z"}`,
		ticket, i%7919, 10+i%90, i%10, 1+i%30, 1+i%40)
}

// ticketTableSQL creates a ticket_list-style read model: the latest version of every ticket.
func ticketTableSQL(table string) string {
	return `CREATE TABLE IF NOT EXISTS ` + table + ` (
		ticket_id text PRIMARY KEY, customer text NOT NULL, price numeric NOT NULL, version bigint NOT NULL)`
}

// ticketUpsertSQL writes one event into table: a later version of a ticket replaces an earlier.
func ticketUpsertSQL(table string) string {
	return `INSERT INTO ` + table + ` (ticket_id, customer, price, version) VALUES ($1, $2, $3, $4)
		ON CONFLICT (ticket_id) DO UPDATE SET customer = EXCLUDED.customer, price = EXCLUDED.price, version = EXCLUDED.version
		WHERE ` + table + `.version < EXCLUDED.version`
}

// ticketUnnestSQL writes a whole batch into table in one statement.
func ticketUnnestSQL(table string) string {
	return `INSERT INTO ` + table + ` (ticket_id, customer, price, version)
		SELECT * FROM unnest($1::text[], $2::text[], $3::numeric[], $4::bigint[])
		ON CONFLICT (ticket_id) DO UPDATE SET customer = EXCLUDED.customer, price = EXCLUDED.price, version = EXCLUDED.version
		WHERE ` + table + `.version < EXCLUDED.version`
}

// The naive baseline: what users write without the library. One transaction per event reads
// the next event with the store's horizon rule, upserts the read model and moves a position.
const (
	naiveSetupSQL = `CREATE TABLE rb_naive_position (transaction_id xid8 NOT NULL, global_position bigint NOT NULL);
		INSERT INTO rb_naive_position VALUES ('0', 0)`
	naiveReadSQL = `SELECT transaction_id, global_position, stream_version, payload FROM nudge_events
		WHERE (transaction_id, global_position) > ($1::xid8, $2::bigint) AND transaction_id < pg_snapshot_xmin(pg_current_snapshot())
		ORDER BY transaction_id, global_position LIMIT 1`
	naiveAdvanceSQL = `UPDATE rb_naive_position SET transaction_id = $1, global_position = $2`
	// limitSQL is the database's own limit: the whole read model in one statement.
	limitSQL = `INSERT INTO rb_limit (ticket_id, customer, price, version)
		SELECT DISTINCT ON (payload->>'ticket_id') payload->>'ticket_id', payload->>'customer', (payload->>'price')::numeric, stream_version
		FROM nudge_events WHERE event_type = $1 AND transaction_id < pg_snapshot_xmin(pg_current_snapshot())
		ORDER BY payload->>'ticket_id', stream_version DESC
		ON CONFLICT (ticket_id) DO UPDATE SET customer = EXCLUDED.customer, price = EXCLUDED.price, version = EXCLUDED.version
		WHERE rb_limit.version < EXCLUDED.version`
)

// rebuildMode is one way of writing the read model.
type rebuildMode struct {
	key   string // in projection and table names
	label string
	def   func(table string, batch int) (*projection.Projection, error)
	// batch, if not 0, is the one batch size the mode runs at (when the run has it).
	batch int
	// share, if not 0, is the part of the events the mode rebuilds: the first 1/share of them.
	share int
}

// The per-event On mode does one round trip per event: over the default size's million events
// it alone would take minutes of the run's ten, and its rate barely depends on the batch size
// or the number of events (RSS@25% against RSS@100% shows the latter). It runs at one batch
// size (500, else the run's largest) over the first tenth of the events. The other modes
// rebuild the first quarter of the same million-event store, so that the default run keeps
// near its ten minutes. The set-based mode in SQL, an extra beside the two, runs at
// the largest batch size only.
var rebuildModes = []rebuildMode{
	{key: "event", label: "per-event (On)", def: perEventProjection, batch: 500, share: 10},
	{key: "queued", label: "per-event, queued (OnQueued)", def: queuedProjection, share: 4},
	{key: "set", label: "set-based (FlushFunc + unnest)", def: setBasedProjection, share: 4},
	{key: "sql", label: "set-based in SQL (OmitPayloads)", def: sqlSetProjection, batch: 1000, share: 4},
}

// runsAt reports whether the mode runs at batch size batch in a run over batches.
func (m rebuildMode) runsAt(batch int, batches []int) bool {
	return m.batch == 0 || m.batch == batch || !slices.Contains(batches, m.batch) && batch == batches[len(batches)-1]
}

// events is how many of total events the mode rebuilds.
func (m rebuildMode) events(total int) int {
	if m.share == 0 {
		return total
	}
	return max(1, total/m.share)
}

func ticketConfig(table string, batch int) projection.Config {
	return projection.Config{
		BatchSize: batch,
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, ticketTableSQL(table))
			return err
		},
		ResetFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `TRUNCATE `+table)
			return err
		},
	}
}

// perEventProjection writes each event with its own statement through the batch's transaction.
func perEventProjection(table string, batch int) (*projection.Projection, error) {
	upsert := ticketUpsertSQL(table)
	return projection.New(table, ticketConfig(table, batch),
		projection.On(rebuildEventType, func(ctx context.Context, tx pgx.Tx, e projection.Event[ticketRegistered]) error {
			_, err := tx.Exec(ctx, upsert, e.Data.TicketID, e.Data.Customer, e.Data.Price, e.StreamVersion)
			return err
		}))
}

// queuedProjection queues the same statement per event; the runner sends a batch's statements
// in one round trip.
func queuedProjection(table string, batch int) (*projection.Projection, error) {
	upsert := ticketUpsertSQL(table)
	return projection.New(table, ticketConfig(table, batch),
		projection.OnQueued(rebuildEventType, func(_ context.Context, q *projection.Queue, e projection.Event[ticketRegistered]) error {
			q.Queue(upsert, e.Data.TicketID, e.Data.Customer, e.Data.Price, e.StreamVersion)
			return nil
		}))
}

// setBasedProjection decodes the batch in its flush hook and writes it with one INSERT … SELECT
// FROM unnest(…); the handler does nothing (it reads no type filter: the store holds one type).
func setBasedProjection(table string, batch int) (*projection.Projection, error) {
	cfg := ticketConfig(table, batch)
	upsert := ticketUnnestSQL(table)
	cfg.FlushFunc = func(ctx context.Context, p projection.FlushParams) error {
		if len(p.Events) == 0 {
			return nil
		}
		rows := newTicketColumns(len(p.Events))
		for _, e := range p.Events {
			var t ticketRegistered
			if err := json.Unmarshal(e.Payload, &t); err != nil {
				return fmt.Errorf("decode event %s: %w", e.ID, err)
			}
			rows.add(t, e.StreamVersion)
		}
		_, err := p.Tx.Exec(ctx, upsert, rows.ids, rows.customers, rows.prices, rows.versions)
		return err
	}
	return projection.New(table, cfg, projection.OnAnyIdempotent(func(context.Context, eventstore.Event) error { return nil }))
}

// ticketFromEventsSQL writes a batch into table in one statement that reads the events'
// payloads itself, by position: the runner reads the batch without payloads (OmitPayloads), and
// PostgreSQL extracts the fields from its jsonb. The events are committed and below the store's
// horizon, so reading them again by position sees exactly what the runner read.
func ticketFromEventsSQL(table string) string {
	return `INSERT INTO ` + table + ` (ticket_id, customer, price, version)
		SELECT DISTINCT ON (payload->>'ticket_id') payload->>'ticket_id', payload->>'customer', (payload->>'price')::numeric, stream_version
		FROM nudge_events WHERE global_position = ANY($1::bigint[])
		ORDER BY payload->>'ticket_id', stream_version DESC
		ON CONFLICT (ticket_id) DO UPDATE SET customer = EXCLUDED.customer, price = EXCLUDED.price, version = EXCLUDED.version
		WHERE ` + table + `.version < EXCLUDED.version`
}

// sqlSetProjection reads its batches without payloads and writes each with one statement that
// takes the payloads from the store's table by position.
func sqlSetProjection(table string, batch int) (*projection.Projection, error) {
	cfg := ticketConfig(table, batch)
	cfg.OmitPayloads = true
	upsert := ticketFromEventsSQL(table)
	cfg.FlushFunc = func(ctx context.Context, p projection.FlushParams) error {
		positions := make([]int64, 0, len(p.Events))
		for _, e := range p.Events {
			if e.Type == rebuildEventType {
				positions = append(positions, e.Position.GlobalPosition)
			}
		}
		if len(positions) == 0 {
			return nil
		}
		_, err := p.Tx.Exec(ctx, upsert, positions)
		return err
	}
	return projection.New(table, cfg, projection.OnAnyIdempotent(func(context.Context, eventstore.Event) error { return nil }))
}

// ticketColumns are a batch's rows as columns for unnest, one row per ticket (its latest
// version): ON CONFLICT DO UPDATE may not touch a row twice in one statement.
type ticketColumns struct {
	index     map[string]int
	ids       []string
	customers []string
	prices    []float64
	versions  []int64
}

func newTicketColumns(n int) *ticketColumns {
	return &ticketColumns{index: make(map[string]int, n), ids: make([]string, 0, n), customers: make([]string, 0, n),
		prices: make([]float64, 0, n), versions: make([]int64, 0, n)}
}

func (c *ticketColumns) add(t ticketRegistered, version int64) {
	if i, ok := c.index[t.TicketID]; ok {
		if version > c.versions[i] {
			c.customers[i], c.prices[i], c.versions[i] = t.Customer, t.Price, version
		}
		return
	}
	c.index[t.TicketID] = len(c.ids)
	c.ids = append(c.ids, t.TicketID)
	c.customers = append(c.customers, t.Customer)
	c.prices = append(c.prices, t.Price)
	c.versions = append(c.versions, version)
}

// expectedVersions returns the rows and sum of versions of the read model built from the first
// n events of eventload's layout over streams streams: event i is version i/streams+1 of stream
// i%streams.
func expectedVersions(n, streams int) (rows, sum int64) {
	for s := range min(n, streams) {
		rows++
		sum += int64((n - s + streams - 1) / streams) // events s, s+streams, … below n
	}
	return rows, sum
}

// rebuildResult is one rebuild of the read model.
type rebuildResult struct {
	took    time.Duration
	events  int
	memory  Memory     // at the end: the peak since the rebuild started
	quarter [4]float64 // the peak RSS when 25/50/75/100 % of the events were committed
	rssNote string     // why the peak could not be reset, if it could not
}

func (r rebuildResult) rate() float64 { return Rate(r.events, r.took) }

// growth is the peak RSS's growth from a quarter of the events to all of them.
func (r rebuildResult) growth() float64 { return r.quarter[3] - r.quarter[0] }

func runRebuild(ctx context.Context, h *harness, sec *Section) error {
	sz := h.sizes
	sec.Params["events"], sec.Params["streams"], sec.Params["naive_events"] = sz.rebuildEvents, sz.rebuildStreams, sz.naiveEvents
	sec.Params["batch_sizes"], sec.Params["payload_bytes"] = sz.batchSizes, len(ticketPayload(eventloadStream(0), 0))
	f, err := h.historyFixture(ctx, 8, sz.rebuildEvents)
	if err != nil {
		return err
	}
	defer f.close()

	table := &Table{Header: []string{"case", "events/s", "baseline", "ratio", "of DB limit", "peak RSS MB", "RSS@25% MB", "RSS@100% MB", "flat"}}
	sec.table = table

	naive, err := runNaive(ctx, h, f, sz.naiveEvents, sz.rebuildStreams)
	if err != nil {
		return fmt.Errorf("naive baseline: %w", err)
	}
	limit, err := runLimit(ctx, f, sz.rebuildEvents, sz.rebuildStreams)
	if err != nil {
		return fmt.Errorf("database limit: %w", err)
	}
	const naiveCase, limitCase = "naive loop (1 tx/event)", "DB limit (1 INSERT…SELECT)"
	sec.AddMetric(Metric{Case: naiveCase, Name: "events_per_s", Unit: "events/s", Value: naive, Extra: map[string]float64{"events": float64(sz.naiveEvents)}})
	sec.AddMetric(Metric{Case: limitCase, Name: "events_per_s", Unit: "events/s", Value: limit})
	table.Add(naiveCase, FormatValue(naive, ""), "", "", FormatValue(100*Ratio(naive, limit), "%"))
	table.Add(limitCase, FormatValue(limit, ""), "", "", "100.0%")

	type best struct {
		label string // the batch size that did best
		rate  float64
	}
	bestOf := map[string]best{}
	var peakCase, growthCase string
	var peak, growth float64
	resetNote := ""
	// Interleaved by batch size, so a noisy minute spreads over the modes.
	for _, batch := range sz.batchSizes {
		for _, mode := range rebuildModes {
			if !mode.runsAt(batch, sz.batchSizes) {
				continue
			}
			label := fmt.Sprintf("%s batch=%d", mode.label, batch)
			if n := mode.events(sz.rebuildEvents); n < sz.rebuildEvents {
				label += fmt.Sprintf(", first %s events", Thousands(int64(n)))
			}
			res, err := rebuildOnce(ctx, h, f, mode, batch)
			if err != nil {
				return fmt.Errorf("%s: %w", label, err)
			}
			rate := res.rate()
			m := Metric{Case: label, Name: "events_per_s", Unit: "events/s", Value: rate,
				Extra: map[string]float64{"batch": float64(batch), "seconds": res.took.Seconds(), "of_db_limit": Ratio(rate, limit),
					"peak_rss_mb": res.memory.PeakMB, "rss_25_mb": res.quarter[0], "rss_50_mb": res.quarter[1], "rss_75_mb": res.quarter[2],
					"rss_100_mb": res.quarter[3], "rss_growth_mb": res.growth()}}
			m = m.WithBaseline(naiveCase, naive)
			sec.AddMetric(m)
			table.Add(label, FormatValue(rate, ""), FormatValue(naive, ""), FormatValue(m.Ratio, "×"), FormatValue(100*Ratio(rate, limit), "%"),
				FormatValue(res.memory.PeakMB, "MB"), FormatValue(res.quarter[0], "MB"), FormatValue(res.quarter[3], "MB"), yesNo(res.growth() <= targetRSSGrowth.Threshold))
			if b := bestOf[mode.key]; rate > b.rate {
				bestOf[mode.key] = best{fmt.Sprintf("best at batch=%d", batch), rate}
			}
			if res.memory.PeakMB > peak {
				peak, peakCase = res.memory.PeakMB, label
			}
			if g := res.growth(); g > growth || growthCase == "" {
				growth, growthCase = g, label
			}
			resetNote = cmpOr(resetNote, res.rssNote)
			h.log.InfoContext(ctx, "rebuild done", slog.String("case", label), slog.Float64("events_per_s", rate),
				slog.Float64("peak_rss_mb", res.memory.PeakMB))
		}
	}
	for _, mode := range rebuildModes[:2] { // the per-event modes
		b := bestOf[mode.key]
		sec.AddCheck(targetPerEvent.about(mode.label), b.label, b.rate)
		sec.AddCheck(targetPerEventNaive.about(mode.label), b.label, Ratio(b.rate, naive))
	}
	for _, mode := range rebuildModes[2:] { // the set-based modes
		sec.AddCheck(targetSetBased.about(mode.label), bestOf[mode.key].label, bestOf[mode.key].rate)
	}
	sec.AddCheck(targetPeakRSS, "highest: "+peakCase, peak)
	sec.AddCheck(targetRSSGrowth, "largest: "+growthCase, growth)
	sec.Note("ratio: events/s over the naive loop's (%s events); of DB limit: share of one INSERT…SELECT over every event", Thousands(int64(sz.naiveEvents)))
	sec.Note("RSS@25%%/100%%: the process's peak RSS when a quarter and all of the events were committed; flat: it grew by at most %s between them",
		WithUnit(targetRSSGrowth.Threshold, targetRSSGrowth.Unit))
	if resetNote != "" {
		sec.Note("%s: peak RSS figures are the process's, not each rebuild's", resetNote)
	}
	return nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// cmpOr returns a if it is not empty, else b.
func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// eventloadStream names stream n as internal/eventload does.
func eventloadStream(n int) string { return fmt.Sprintf("ticket-%05d", n) }

// rebuildOnce resets the mode's projection at batch size batch and catches it up over the
// mode's share of the store (pausing it there), measuring the time and the process's peak RSS,
// and checks the read model it built.
func rebuildOnce(ctx context.Context, h *harness, f *fixture, mode rebuildMode, batch int) (rebuildResult, error) {
	table := "rb_" + mode.key
	p, err := mode.def(table, batch)
	if err != nil {
		return rebuildResult{}, err
	}
	total := mode.events(h.sizes.rebuildEvents)
	var (
		res        rebuildResult
		runner     *projection.Runner
		done, next int
		pauseErr   error
	)
	runner, err = projection.NewRunner(f.backend, projection.RunnerConfig{Logger: h.libLog, OnBatch: func(b projection.BatchReport) {
		if b.Err != nil {
			return
		}
		done += b.Events
		for next < 4 && done*4 >= (next+1)*total {
			if m, err := ReadMemory(); err == nil {
				res.quarter[next] = m.PeakMB
			}
			next++
		}
		if done >= total && total < h.sizes.rebuildEvents && pauseErr == nil {
			// The batch committed: the next one finds the projection paused and the catch-up ends.
			pauseErr = runner.Pause(ctx, p.Name())
		}
	}}, p)
	if err != nil {
		return res, err
	}
	if err := runner.Init(ctx); err != nil {
		return res, err
	}
	if err := runner.Resume(ctx, p.Name()); err != nil { // paused by an earlier partial rebuild
		return res, err
	}
	if err := runner.Reset(ctx, p.Name()); err != nil {
		return res, err
	}
	if err := ResetPeakRSS(); err != nil {
		res.rssNote = err.Error()
	}
	started := time.Now()
	cu, err := runner.CatchUp(ctx, p.Name())
	res.took = time.Since(started)
	if err = errors.Join(err, pauseErr); err != nil {
		return res, err
	}
	res.events = cu.Events
	if res.memory, err = ReadMemory(); err != nil {
		res.rssNote = err.Error()
	}
	if cu.Events < total || cu.Events > total && !cu.Paused {
		return res, fmt.Errorf("handled %d events, want %d", cu.Events, total)
	}
	return res, f.checkTickets(ctx, table, cu.Events, h.sizes.rebuildStreams)
}

// checkTickets checks that table holds the read model of the first n events.
func (f *fixture) checkTickets(ctx context.Context, table string, n, streams int) error {
	rows, sum, err := f.count(ctx, table)
	if err != nil {
		return err
	}
	if wantRows, wantSum := expectedVersions(n, streams); rows != wantRows || sum != wantSum {
		return fmt.Errorf("read model %s is wrong: %d rows with versions summing to %d, want %d and %d", table, rows, sum, wantRows, wantSum)
	}
	return nil
}

// runNaive runs the naive loop over the first n events and returns its events/s.
func runNaive(ctx context.Context, h *harness, f *fixture, n, streams int) (float64, error) {
	if _, err := f.db.pool.Exec(ctx, ticketTableSQL("rb_naive")+`; `+naiveSetupSQL); err != nil {
		return 0, err
	}
	upsert := ticketUpsertSQL("rb_naive")
	var after eventstore.Position
	started := time.Now()
	for range n {
		done, err := naiveHandleOne(ctx, f, upsert, &after)
		if err != nil {
			return 0, err
		}
		if done {
			return 0, errors.New("the store ran out of events")
		}
	}
	took := time.Since(started)
	h.log.InfoContext(ctx, "rebuild: naive loop done", slog.Int("events", n), slog.Duration("took", took.Round(time.Millisecond)))
	return Rate(n, took), f.checkTickets(ctx, "rb_naive", n, streams)
}

// naiveHandleOne handles the event after *after in a transaction of its own; done is true when
// there is none.
func naiveHandleOne(ctx context.Context, f *fixture, upsert string, after *eventstore.Position) (done bool, err error) {
	tx, err := f.db.pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op after Commit
	var (
		pos     eventstore.Position
		version int64
		payload []byte
		t       ticketRegistered
	)
	err = tx.QueryRow(ctx, naiveReadSQL, after.TransactionID, after.GlobalPosition).Scan(&pos.TransactionID, &pos.GlobalPosition, &version, &payload)
	if errors.Is(err, pgx.ErrNoRows) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	if err := json.Unmarshal(payload, &t); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, upsert, t.TicketID, t.Customer, t.Price, version); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, naiveAdvanceSQL, pos.TransactionID, pos.GlobalPosition); err != nil {
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, err
	}
	*after = pos
	return false, nil
}

// runLimit builds the read model with one statement over every event and returns events/s.
func runLimit(ctx context.Context, f *fixture, n, streams int) (float64, error) {
	if _, err := f.db.pool.Exec(ctx, ticketTableSQL("rb_limit")); err != nil {
		return 0, err
	}
	started := time.Now()
	if _, err := f.db.pool.Exec(ctx, limitSQL, rebuildEventType); err != nil {
		return 0, err
	}
	return Rate(n, time.Since(started)), f.checkTickets(ctx, "rb_limit", n, streams)
}
