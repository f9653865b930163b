package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"
)

// fleetPool bounds each fleet run's pools (the store's and the PostgreSQL queue's): a
// deployment sizes its pool, it does not open a connection per projection; and the server's
// max_connections is shared.
const fleetPool = 16

// fleetIdleSettle is how long idle projections run before their window: their start-up
// catch-ups done, and those transactions counted, which an idle backend reports to
// pg_stat_database up to 10 s late (PostgreSQL 15's PGSTAT_IDLE_INTERVAL).
const fleetIdleSettle = 15 * time.Second

// fleetBase is the projection count the growth of the others is measured against.
const fleetBase = 10

// The fleet scenario's targets: nothing superlinear in the projections, and a fleet of idle
// projections about free.
var (
	targetFleetGrowth = Target{Name: "PostgreSQL CPU per event × projection at 300 projections over at 10", Op: AtMost, Threshold: 1.5, Unit: "×"}
	targetFleetIdle   = Target{Name: "transactions/s of 300 idle projections in all", Op: AtMost, Threshold: 30, Unit: "tx/s"}
)

// fleetCase is one live run of the fleet scenario.
type fleetCase struct {
	channel     string
	projections int
	workers     int
}

func (c fleetCase) label() string {
	w := "1 worker"
	if c.workers > 1 {
		w = fmt.Sprintf("%d workers", c.workers)
	}
	return fmt.Sprintf("%s, %d projection(s), %s", channelLabels[c.channel], c.projections, w)
}

// base is the case c's cost per event × projection is compared to.
func (c fleetCase) base() fleetCase { c.projections = fleetBase; return c }

// fleetCases are the live runs: every projection count on each channel and worker count
// (-quick: RabbitMQ and one worker only).
func fleetCases(quick bool, counts []int) []fleetCase {
	channels, workers := []string{chAMQP, chPostgres}, []int{1, 4}
	if quick {
		channels, workers = []string{chAMQP}, []int{1}
	}
	var out []fleetCase
	for _, ch := range channels {
		for _, w := range workers {
			for _, n := range counts {
				out = append(out, fleetCase{channel: ch, projections: n, workers: w})
			}
		}
	}
	return out
}

// fleetFigures are what one live run cost, over its measured window.
type fleetFigures struct {
	latency            Latency
	appended           int
	appendsPerS        float64 // over the append window
	seconds            float64 // from the first measured append until every event was visible
	pgCPU              time.Duration
	processCPU         time.Duration // this process's CPU over the window
	machineBusy        time.Duration // the whole machine's busy CPU over the window (MachineBusy)
	writersCPU         time.Duration // the writers' backends' part of pgCPU (the appends)
	transactions       int64
	batches, catchUps  int64
	connections, queue int
}

// perEventProjection is the PostgreSQL CPU per event × projection, in µs.
func (f fleetFigures) perEventProjection(projections int) float64 {
	if f.appended == 0 || projections == 0 {
		return 0
	}
	return float64(f.pgCPU.Microseconds()) / float64(f.appended*projections)
}

// marginal is what each projection beyond the first adds to the server's CPU per event (µs),
// from the CPU per event with one projection and with n.
func marginal(one, withN float64, n int) float64 {
	if n <= 1 {
		return 0
	}
	return (withN - one) / float64(n-1)
}

// runFleet runs the fleet scenario: many projections (OnQueued, a small read model each) at
// a fixed append rate, and what each count costs the server per event and projection; then
// what 300 idle projections cost.
func runFleet(ctx context.Context, h *harness, sec *Section) error {
	sz := h.sizes
	sec.Params["projections"], sec.Params["appends_per_s"], sec.Params["window_s"] = sz.fleetProjections, sz.fleetRate, sz.fleetDuration.Seconds()
	sec.Params["pool_connections"], sec.Params["idle_window_s"], sec.Params["writers"] = fleetPool, sz.fleetIdleWindow.Seconds(), sz.liveWriters
	table := &Table{Header: []string{"case", "appends/s", "p50 ms", "p99 ms", "PG CPU µs per event×projection", "× at 10", "µs per event per added projection", "tx per append", "triggers/s", "batches/s", "connections", "broker queues"}}
	sec.table = table
	byCase := map[fleetCase]float64{}   // PostgreSQL CPU per event × projection
	perEvent := map[fleetCase]float64{} // PostgreSQL CPU per event, all projections
	var failed []error
	var live []fleetCase
	if !h.opts.fleetIdleOnly {
		live = fleetCases(h.opts.quick, sz.fleetProjections)
	}
	for _, c := range live {
		fig, err := h.fleetRun(ctx, c)
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			failed = append(failed, fmt.Errorf("%s: %w", c.label(), err))
			sec.Note("%s failed: %v", c.label(), err)
			continue
		}
		per := fig.perEventProjection(c.projections)
		byCase[c] = per
		m := Metric{Case: c.label(), Name: "pg_cpu_us_per_event_projection", Unit: "µs", Value: per, Extra: fig.latency.Extra()}
		m.Extra["appends_per_s"] = fig.appendsPerS
		m.Extra["pg_cpu_us_per_event"] = per * float64(c.projections)
		added := "—"
		if one, ok := perEvent[fleetCase{channel: c.channel, projections: 1, workers: c.workers}]; ok && c.projections > 1 {
			m.Extra["pg_cpu_us_per_event_added_projection"] = marginal(one, per*float64(c.projections), c.projections)
			added = FormatValue(m.Extra["pg_cpu_us_per_event_added_projection"], "")
		}
		perEvent[c] = per * float64(c.projections)
		m.Extra["pg_cpu_s"], m.Extra["tx_per_append"] = fig.pgCPU.Seconds(), Ratio(float64(fig.transactions), float64(fig.appended))
		m.Extra["triggers_per_s"], m.Extra["batches_per_s"] = Ratio(float64(fig.catchUps), fig.seconds), Ratio(float64(fig.batches), fig.seconds)
		m.Extra["connections"], m.Extra["broker_queues"] = float64(fig.connections), float64(fig.queue)
		m.Extra["machine_cores"] = Ratio(fig.machineBusy.Seconds(), fig.seconds)
		ratio := ""
		if base, ok := byCase[c.base()]; ok && c.projections != fleetBase {
			m = m.WithBaseline(c.base().label(), base)
			ratio = FormatValue(m.Ratio, "×")
			if c.projections == 300 {
				sec.AddCheck(targetFleetGrowth, c.label(), m.Ratio)
			}
		}
		sec.AddMetric(Metric{Case: c.label(), Name: "p50_ms", Unit: "ms", Value: Ms(fig.latency.P50)})
		sec.AddMetric(Metric{Case: c.label(), Name: "p99_ms", Unit: "ms", Value: Ms(fig.latency.P99), Extra: fig.latency.Extra()})
		sec.AddMetric(m)
		if v, ok := m.Extra["pg_cpu_us_per_event_added_projection"]; ok {
			sec.AddMetric(Metric{Case: c.label(), Name: "pg_cpu_us_per_event_added_projection", Unit: "µs", Value: v})
		}
		// The page shows Value only: each figure of the growth table is a metric of its own.
		sec.AddMetric(Metric{Case: c.label(), Name: "tx_per_100_appends", Unit: "tx", Value: 100 * m.Extra["tx_per_append"]})
		sec.AddMetric(Metric{Case: c.label(), Name: "triggers_per_s", Unit: "triggers/s", Value: m.Extra["triggers_per_s"]})
		sec.AddMetric(Metric{Case: c.label(), Name: "batches_per_s", Unit: "batches/s", Value: m.Extra["batches_per_s"]})
		sec.AddMetric(Metric{Case: c.label(), Name: "connections", Unit: "connections", Value: float64(fig.connections)})
		if c.channel == chAMQP {
			sec.AddMetric(Metric{Case: c.label(), Name: "broker_queues", Unit: "queues", Value: float64(fig.queue)})
		}
		queues := "—"
		if c.channel == chAMQP {
			queues = strconv.Itoa(fig.queue)
		}
		table.Add(c.label(), FormatValue(m.Extra["appends_per_s"], ""), FormatValue(Ms(fig.latency.P50), "ms"), FormatValue(Ms(fig.latency.P99), "ms"),
			FormatValue(per, ""), ratio, added, fmt.Sprintf("%.1f", m.Extra["tx_per_append"]), FormatValue(m.Extra["triggers_per_s"], ""),
			FormatValue(m.Extra["batches_per_s"], ""), strconv.Itoa(fig.connections), queues)
		h.log.InfoContext(ctx, "fleet run done", slog.String("case", c.label()), slog.Float64("pg_cpu_us_per_event_projection", per),
			slog.Duration("p99", fig.latency.P99))
	}

	idleChannels := []string{chPostgres, chAMQP}
	if h.opts.quick {
		idleChannels = idleChannels[:1]
	}
	for _, ch := range idleChannels {
		var baseCase string
		var base float64
		for _, idle := range []int{fleetBase, sz.fleetProjections[len(sz.fleetProjections)-1]} {
			rate, err := h.idleRun(ctx, ch, idle, fleetPool, fleetIdleSettle, sz.fleetIdleWindow)
			if err != nil {
				if ctx.Err() != nil {
					return err
				}
				failed = append(failed, fmt.Errorf("%d idle on %s: %w", idle, channelLabels[ch], err))
				continue
			}
			c := fmt.Sprintf("%s, %d idle projections", channelLabels[ch], idle)
			m := Metric{Case: c, Name: "tx_per_s", Unit: "tx/s", Value: rate, Extra: map[string]float64{"tx_per_s_per_projection": rate / float64(idle)}}
			ratio := ""
			if baseCase == "" {
				baseCase, base = c, m.Value
			} else {
				m = m.WithBaseline(baseCase, base)
				ratio = FormatValue(m.Ratio, "×")
			}
			sec.AddMetric(m)
			if idle == 300 {
				sec.AddCheck(targetFleetIdle, c, rate)
			}
			table.Add(c, "0", "", "", "", "", "", fmt.Sprintf("%.1f tx/s (%.2f per projection) %s", rate, rate/float64(idle), ratio), "", "", "", "")
		}
	}
	sec.Note("each projection: OnQueued, one upsert per event into a table of its own (a stream's latest version), committed per batch; %d appends/s from %d writers over %d streams; RabbitMQ fed by a relay, the PostgreSQL queue by the appends' transactions (relay.Appender)",
		sz.fleetRate, sz.liveWriters, sz.liveStreams)
	sec.Note("PG CPU: user+system time of the run database's server backends (/proc/<pid>/stat of the pids pg_stat_activity lists at the window's start and end); tx: pg_stat_database xact_commit+xact_rollback of the run's database (its statistics may lag about a second)")
	sec.Note("4 workers: in this process, each its own worker over a quarter of the projections (round robin), sharing the pools (%d connections each; the writers have one of their own) and the first worker's relay; broker queues: those declared for the run (one per projection)", fleetPool)
	sec.Note("idle: after %s of start-up, no appends, woken by LISTEN/NOTIFY unless -no-listen, the worker's 30 s safety net on", fleetIdleSettle)
	return errors.Join(failed...)
}

// fleetRun runs one live case and measures the server's cost over its window.
func (h *harness) fleetRun(ctx context.Context, c fleetCase) (fleetFigures, error) {
	var fig fleetFigures
	sz := h.sizes
	var probe *backendProbe
	cfg := liveConfig{channel: c.channel, projections: c.projections, workers: c.workers, poolSize: fleetPool,
		rate: sz.fleetRate, writers: sz.liveWriters, streams: sz.liveStreams, duration: sz.fleetDuration,
		window: func(f *fixture) (func() error, error) {
			var err error
			if probe, err = h.startProbe(ctx, f.db.name); err != nil {
				return nil, err
			}
			proc, machine := ProcessCPU(), MachineBusy()
			return func() error {
				fig.pgCPU, fig.transactions, fig.connections, err = probe.end(ctx)
				fig.processCPU, fig.writersCPU = ProcessCPU()-proc, probe.writersCPU
				fig.machineBusy = MachineBusy() - machine
				return err
			}, nil
		}}
	res, err := h.runLive(ctx, cfg)
	if err != nil {
		return fig, err
	}
	fig.latency, fig.appended, fig.appendsPerS, fig.seconds = res.latency, res.appended, res.appendsPerS, res.measured.Seconds()
	fig.batches, fig.catchUps = res.batches, res.catchUps
	if c.channel == chAMQP {
		fig.queue = c.projections
	}
	return fig, nil
}

// backendProbe measures a database's server backends: their CPU (from /proc, the server
// being on this machine) and the database's transactions.
type backendProbe struct {
	h        *harness
	database string
	cpu      map[int]time.Duration
	xacts    int64
	// writers are the backends of the live run's writers (writersApplication), as far as
	// seen: their CPU is also counted apart (writersCPU).
	writers map[int]bool
	// writersCPU is, after end, the writers' backends' part of the CPU end returned.
	writersCPU time.Duration
}

// startProbe reads the database's backends' CPU and its transactions so far.
func (h *harness) startProbe(ctx context.Context, database string) (*backendProbe, error) {
	p := &backendProbe{h: h, database: database, writers: map[int]bool{}}
	var err error
	if p.cpu, err = p.backendsCPU(ctx); err != nil {
		return nil, err
	}
	if err := h.admin.QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1`, database).Scan(&p.xacts); err != nil {
		return nil, err
	}
	return p, nil
}

// end returns the backends' CPU since the start (those that ended in between are lost; those
// that started count whole), the transactions since the start and the connections open now.
func (p *backendProbe) end(ctx context.Context) (time.Duration, int64, int, error) {
	now, err := p.backendsCPU(ctx)
	if err != nil {
		return 0, 0, 0, err
	}
	var xacts int64
	if err := p.h.admin.QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1`, p.database).Scan(&xacts); err != nil {
		return 0, 0, 0, err
	}
	writersNow := make(map[int]time.Duration, len(p.writers))
	for pid := range p.writers {
		if cpu, ok := now[pid]; ok {
			writersNow[pid] = cpu
		}
	}
	p.writersCPU = cpuGrowth(p.cpu, writersNow)
	return cpuGrowth(p.cpu, now), xacts - p.xacts, len(now), nil
}

// cpuGrowth is the CPU the processes of now used since before: a pid new in now counts whole.
func cpuGrowth(before, now map[int]time.Duration) time.Duration {
	var d time.Duration
	for pid, cpu := range now {
		d += cpu - before[pid]
	}
	return d
}

// backendsCPU returns the CPU time so far of each backend connected to the database.
func (p *backendProbe) backendsCPU(ctx context.Context) (map[int]time.Duration, error) {
	rows, err := p.h.admin.Query(ctx, `SELECT pid, application_name = $2 FROM pg_stat_activity WHERE datname = $1`, p.database, writersApplication)
	if err != nil {
		return nil, err
	}
	var pids []int32
	for rows.Next() {
		var (
			pid    int32
			writer bool
		)
		if err := rows.Scan(&pid, &writer); err != nil {
			rows.Close()
			return nil, err
		}
		pids = append(pids, pid)
		if writer {
			p.writers[int(pid)] = true
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := make(map[int]time.Duration, len(pids))
	for _, pid := range pids {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) { // the backend ended, or the server is elsewhere
				continue
			}
			return nil, err
		}
		cpu, err := parseStatCPU(data)
		if err != nil {
			return nil, fmt.Errorf("backend %d: %w", pid, err)
		}
		out[int(pid)] = cpu
	}
	return out, nil
}

// clockTick is the kernel's USER_HZ, the unit of /proc/<pid>/stat's times (100 on Linux).
const clockTick = 10 * time.Millisecond

// parseStatCPU returns utime + stime out of the text of /proc/<pid>/stat.
func parseStatCPU(stat []byte) (time.Duration, error) {
	s := string(stat)
	i := strings.LastIndexByte(s, ')') // the command may hold spaces and parentheses
	if i < 0 {
		return 0, errors.New("malformed /proc/<pid>/stat: no command")
	}
	fields := strings.Fields(s[i+1:])
	// After the command: state (3), …, utime (14), stime (15), counted from pid (1).
	if len(fields) < 13 {
		return 0, fmt.Errorf("malformed /proc/<pid>/stat: %d fields after the command", len(fields))
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("malformed /proc/<pid>/stat: %w", err)
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
}
