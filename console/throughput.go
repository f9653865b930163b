package console

import (
	"strconv"
	"sync"
	"time"
)

// throughputWindow is the least time a throughput is measured over: reads of a status closer
// together than that (two open overviews, a page beside the overview) share the last rate.
const throughputWindow = time.Second

// throughput is each projection's events per second, from the growth of its EventsProcessed
// between the console's reads of its status: no query of its own, a map look-up per
// projection. It is the console's own, so a freshly started console knows no rate until its
// second read at least throughputWindow after the first.
type throughput struct {
	mu   sync.Mutex
	last map[string]sample
}

// sample is a projection's processed count when it was read, and the rate measured then.
type sample struct {
	processed int64
	at        time.Time
	rate      float64
	known     bool
}

func newThroughput() *throughput { return &throughput{last: map[string]sample{}} }

// observe records that projection n had processed events at now and returns its rate in
// events per second, false while unknown: at the first read, or the first after its count went
// back (a rebuild).
func (t *throughput) observe(n string, processed int64, now time.Time) (float64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.observeLocked(n, processed, now)
}

func (t *throughput) observeLocked(n string, processed int64, now time.Time) (float64, bool) {
	s, ok := t.last[n]
	switch {
	case !ok || processed < s.processed:
		t.last[n] = sample{processed: processed, at: now}
		return 0, false
	case now.Sub(s.at) < throughputWindow:
		return s.rate, s.known
	}
	rate := float64(processed-s.processed) / now.Sub(s.at).Seconds()
	t.last[n] = sample{processed: processed, at: now, rate: rate, known: true}
	return rate, true
}

// observeAll observes every projection in processed (by name) and forgets those no longer
// there; it returns the rates of those known.
func (t *throughput) observeAll(processed map[string]int64, now time.Time) map[string]float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	for n := range t.last {
		if _, ok := processed[n]; !ok {
			delete(t.last, n)
		}
	}
	rates := make(map[string]float64, len(processed))
	for n, p := range processed {
		if r, ok := t.observeLocked(n, p, now); ok {
			rates[n] = r
		}
	}
	return rates
}

// rate is events per second the short way: "0/s", "0.4/s", "12/s", "1.2k/s", "35k/s".
func rate(perSecond float64) string {
	switch {
	case perSecond <= 0:
		return "0/s"
	case perSecond < 9.95: // 9.96 reads "10/s", not "10.0/s"
		return strconv.FormatFloat(perSecond, 'f', 1, 64) + "/s"
	case perSecond < 10_000:
		return strconv.FormatFloat(perSecond, 'f', 0, 64) + "/s"
	case perSecond < 100_000:
		return strconv.FormatFloat(perSecond/1000, 'f', 1, 64) + "k/s"
	}
	return strconv.FormatFloat(perSecond/1000, 'f', 0, 64) + "k/s"
}
