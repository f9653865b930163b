package console

import (
	"net/http"
	"time"
)

// SetClock makes the console h read the time from now (for the throughput's tests).
func SetClock(h http.Handler, now func() time.Time) { h.(*console).now = now }
