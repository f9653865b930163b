package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/metrics"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/worker"
)

// registered is one collector and the call that registered it.
type registered struct {
	by string
	c  prometheus.Collector
}

// recorder is a Registerer that remembers what it registers, and for whom.
type recorder struct {
	prometheus.Registerer
	by  string
	got []registered
}

func (r *recorder) Register(c prometheus.Collector) error {
	if err := r.Registerer.Register(c); err != nil {
		return err
	}
	r.got = append(r.got, registered{r.by, c})
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// The stand-ins the collectors read at scrape time.
type (
	stubRunner     struct{}
	stubWorker     struct{}
	stubDeadLetter struct{}
)

const stubProjection = "example"

func (stubRunner) Names() []string { return []string{stubProjection} }
func (stubRunner) Status(context.Context, string) (projection.Status, error) {
	return projection.Status{Name: stubProjection, State: projection.StateRunning, Version: 1, VersionState: projection.VersionActive}, nil
}
func (stubWorker) Stats(string) worker.Stats { return worker.Stats{} }
func (stubDeadLetter) List(context.Context, deadletter.Filter) ([]deadletter.Record, error) {
	return nil, nil
}

// registerAll registers every collector of package metrics on rec, each through the call a
// user makes.
func registerAll(rec *recorder) error {
	rec.by = "metrics.New"
	m, err := metrics.New(metrics.Config{Registerer: rec})
	if err != nil {
		return err
	}
	rec.by = "WatchRunner"
	if err := m.WatchRunner(stubRunner{}); err != nil {
		return err
	}
	rec.by = "WatchWorker"
	if err := m.WatchWorker(stubWorker{}, stubProjection); err != nil {
		return err
	}
	rec.by = "WatchDeadLetters"
	if err := m.WatchDeadLetters(stubDeadLetter{}, stubProjection); err != nil {
		return err
	}
	rec.by = "AddRouterMetrics"
	return runRouter(m)
}

// runRouter adds the router metrics to a router with one handler and runs it until it is
// running: Watermill registers its subscriber and publisher metrics then.
func runRouter(m *metrics.Metrics) error {
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	if err := m.AddRouterMetrics(router); err != nil {
		return err
	}
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer func() { _ = pubSub.Close() }()
	router.AddHandler(worker.HandlerPrefix+stubProjection, "in", pubSub, "out", pubSub,
		func(*message.Message) ([]*message.Message, error) { return nil, nil })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	select {
	case <-router.Running():
	case err := <-done:
		return fmt.Errorf("the router stopped before running: %w", err)
	case <-ctx.Done():
		return errors.New("the router did not start within a minute")
	}
	if err := router.Close(); err != nil {
		return err
	}
	return <-done
}

// metricRow is one line of the metrics table.
type metricRow struct {
	name, typ, help, by string
	labels              []string
}

var descRE = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*"), help: ("(?:[^"\\]|\\.)*"), constLabels: \{(.*)\}, variableLabels: \{(.*)\}\}$`)

// parseDesc reads a descriptor's name, help and labels from its String (client_golang gives
// no accessors).
func parseDesc(d *prometheus.Desc) (name, help string, labels []string, err error) {
	m := descRE.FindStringSubmatch(d.String())
	if m == nil {
		return "", "", nil, fmt.Errorf("unexpected descriptor %s", d)
	}
	if name, err = strconv.Unquote(m[1]); err != nil {
		return "", "", nil, err
	}
	if help, err = strconv.Unquote(m[2]); err != nil {
		return "", "", nil, err
	}
	for _, l := range strings.Split(m[3], ",") {
		if l != "" {
			labels = append(labels, l) // a constant label: name="value"
		}
	}
	for _, l := range strings.Split(m[4], ",") {
		if l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"); l != "" {
			labels = append(labels, l)
		}
	}
	return name, help, labels, nil
}

// vecType is the type of a vector collector, which exposes nothing before its first label
// values.
func vecType(c prometheus.Collector) string {
	switch c.(type) {
	case *prometheus.CounterVec:
		return "counter"
	case *prometheus.GaugeVec:
		return "gauge"
	case *prometheus.HistogramVec:
		return "histogram"
	case *prometheus.SummaryVec:
		return "summary"
	}
	return ""
}

// metricRows registers every collector in a fresh registry and lists their descriptors,
// typed by what a scrape returns (or the vector's kind).
func metricRows() ([]metricRow, error) {
	reg := prometheus.NewRegistry()
	rec := &recorder{Registerer: reg}
	if err := registerAll(rec); err != nil {
		return nil, err
	}
	families, err := reg.Gather()
	if err != nil {
		return nil, fmt.Errorf("gather: %w", err)
	}
	types := map[string]string{}
	for _, f := range families {
		types[f.GetName()] = strings.ToLower(f.GetType().String())
	}
	var rows []metricRow
	for _, r := range rec.got {
		ch := make(chan *prometheus.Desc, 64)
		go func() { r.c.Describe(ch); close(ch) }()
		for d := range ch {
			name, help, labels, err := parseDesc(d)
			if err != nil {
				return nil, err
			}
			typ := types[name]
			if typ == "" {
				typ = vecType(r.c)
			}
			if typ == "" {
				return nil, fmt.Errorf("%s: no type: a scrape returned nothing for it and its collector (%T) is no vector", name, r.c)
			}
			rows = append(rows, metricRow{name: name, typ: typ, help: help, by: r.by, labels: labels})
		}
	}
	return rows, nil
}

// metricsReference renders docs/reference/metrics.md.
func metricsReference() ([]byte, error) {
	rows, err := metricRows()
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString(generatedHeader("Metrics reference", "the descriptors of the collectors package metrics registers"))
	b.WriteString("Every Prometheus metric of package `metrics`, with the default namespace `nudge` " +
		"(`metrics.Config.Namespace`). *Registered by* names the call that registers it: " +
		"`metrics.New` (batch metrics, counted in this process), `WatchRunner`, `WatchWorker` and " +
		"`WatchDeadLetters` (read at scrape time), `AddRouterMetrics` (Watermill's router metrics). " +
		"`go doc github.com/nudgeworks/nudge/metrics` explains the labels' values.\n\n")
	b.WriteString("A constant label shows its value (`source=\"status\"`).\n\n")
	b.WriteString("| Name | Type | Labels | Registered by | Help |\n|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| `%s` | %s | %s | `%s` | %s |\n", r.name, r.typ, codeList(r.labels), r.by, oneLine(r.help))
	}
	return b.Bytes(), nil
}

// codeList writes names as code, comma-separated; — for none.
func codeList(names []string) string {
	if len(names) == 0 {
		return "—"
	}
	return "`" + strings.Join(names, "`, `") + "`"
}
