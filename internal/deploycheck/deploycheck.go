// Package deploycheck checks what nudge ships for operators in deploy/: the Prometheus alert
// rules (promtool check rules and test rules) and the Grafana dashboard, whose every query must
// name only metrics package metrics exports. Its tests do the checking; this file holds the
// helpers they share.
package deploycheck

import (
	"regexp"
	"slices"
)

// metricRE matches a nudge metric name in PromQL: every metric nudge exports starts with its
// namespace, nudge_ (metrics.NamespaceDefault).
var metricRE = regexp.MustCompile(`\bnudge_[a-zA-Z0-9_]+`)

// MetricNames returns the nudge metric names expr refers to, sorted and without repeats.
func MetricNames(expr string) []string {
	names := metricRE.FindAllString(expr, -1)
	slices.Sort(names)
	return slices.Compact(names)
}
