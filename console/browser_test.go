package console_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge"
	amqpchannel "github.com/nudgeworks/nudge/channel/amqp"
	"github.com/nudgeworks/nudge/console"
	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/amqptest"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/retry"
)

// chromiumPath is where Debian's chromium package puts the browser (scripts/tools.sh
// installs it).
const chromiumPath = "/usr/bin/chromium"

// browser starts a headless Chromium for t and returns a tab's context. Without the browser
// the test skips, or fails with CI=true.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		if _, statErr := os.Stat(chromiumPath); statErr != nil {
			msg := "console: no chromium to drive (install it with scripts/tools.sh, or apt-get install chromium)"
			if os.Getenv("CI") == "true" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
		path = chromiumPath
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-component-update", true), chromedp.UserDataDir(t.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(testwait.Context(t, 3*time.Minute), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	require.NoError(t, chromedp.Do(ctx), "start chromium")
	return ctx
}

type ticket struct {
	ID    string `json:"id"`
	Title string `json:"title"`
}

// retryInterval is the wait between the tickets projection's two attempts on an event: longer
// than the pages' refresh, so an open page shows a poison event before it is retried.
const retryInterval = 5 * time.Second

// hostile is a title that would run script, or recolour a terminal, if shown unescaped.
const hostile = `poison <script>window.pwned=1</script><img src=x onerror="window.pwned=2"> ` + "\x1b[31mred\x1b[0m \u202e"

// TestBrowser drives the console in headless Chromium against a worker on PostgreSQL and
// RabbitMQ: a poison event shows on its projection's open page within one retry cycle (payload
// as text, its script not run), and the overview open beside it shows the projection failing
// with a dead letter; a replay clicked after the fix heals the projection and both show it
// caught up, each refreshed in place; a parked stream is redriven from the page; a POST
// without the token is refused; a read-only console reads with JavaScript off, has no forms
// and refuses a POST.
func TestBrowser(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	pool := pgtest.New(t).NewPool(t, 16)
	env := amqptest.New(t)
	logger := testlog.New(t)
	ch, err := amqpchannel.New(t.Context(), amqpchannel.Config{URL: env.URL, Prefix: env.Prefix, ConnectionName: env.ConnectionName, Logger: logger})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })

	var broken atomic.Bool
	broken.Store(true)
	fail := func(title string) error {
		if broken.Load() && strings.HasPrefix(title, "poison") {
			return errors.New("cannot project " + title)
		}
		return nil
	}
	tickets, err := projection.New("tickets", projection.Config{},
		projection.OnIdempotent("TicketRegistered", func(_ context.Context, e projection.Event[ticket]) error { return fail(e.Data.Title) }))
	require.NoError(t, err)
	parker, err := projection.New("parker", projection.Config{OnFailure: projection.OnFailurePark},
		projection.OnIdempotent("TicketRegistered", func(_ context.Context, e projection.Event[ticket]) error {
			if err := fail(e.Data.Title); err != nil {
				return retry.Permanent(err)
			}
			return nil
		}))
	require.NoError(t, err)
	client := run(t, pool, nudge.Config{Channel: ch, Projections: []*projection.Projection{tickets, parker}, Logger: logger,
		SafetyNetInterval: -1, // only the console's actions heal here
		Retry:             retry.Policy{MaxAttempts: 2, InitialInterval: retryInterval, MaxInterval: retryInterval, Jitter: -1}})

	h, err := console.New(console.Config{DB: pool, Channel: ch, Writes: true, BasePath: "/console", Actor: "browser test", Logger: logger})
	require.NoError(t, err)
	ro, err := console.New(console.Config{DB: pool, BasePath: "/ro", Logger: logger})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/console/", h)
	mux.Handle("/ro/", ro)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	// The page, and the overview in a second tab, are open before the poison event comes.
	wait := chromedp.WithPollingTimeout(testwait.For(time.Minute))
	every := chromedp.WithPollingInterval(50 * time.Millisecond)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(srv.URL+"/console/projections/tickets"),
		chromedp.WaitVisible(chromedp.ID("condition")),
	))
	overview, cancelOverview := chromedp.NewContext(ctx)
	t.Cleanup(cancelOverview)
	require.NoError(t, chromedp.Do(overview,
		chromedp.Navigate(srv.URL+"/console/"),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-projection="tickets"]`)),
	))
	ticketsRow := func(condition, deadLetters string) chromedp.Action[bool] {
		return chromedp.Poll[bool](`(r => r.querySelector("td.condition").textContent === "`+condition+`" &&
			r.querySelector("td.deadletters").textContent === "`+deadLetters+`")(document.querySelector('tr[data-projection="tickets"]'))`, wait, every)
	}
	for i, title := range []string{"fine", hostile, "fine too"} {
		data, err := eventstore.NewEventData("TicketRegistered", ticket{ID: string(rune('a' + i)), Title: title})
		require.NoError(t, err)
		_, err = client.Append(t.Context(), "ticket-"+string(rune('a'+i)), eventstore.NoStream, data)
		require.NoError(t, err)
	}

	// The poison event shows on the open page, without a reload, within one retry cycle: at its
	// first attempt, before the second; its payload as text.
	run1(t, ctx, chromedp.Poll[bool](`document.getElementById("payload") !== null`, wait, every))
	require.Equal(t, "1", run1(t, ctx, chromedp.Text(chromedp.ID("attempts"))), "the page showed the poison event after the retry, not before it")
	payload := run1(t, ctx, chromedp.Text(chromedp.ID("payload")))
	require.Contains(t, payload, "<script>window.pwned=1</script>")
	require.Contains(t, payload, `onerror=\"window.pwned=2\"`)
	require.Contains(t, run1(t, ctx, chromedp.Text(chromedp.ID("last-error"))), `\x1b[31mred\x1b[0m \u202e`, "the terminal escape and the bidi override show as text")
	require.False(t, run1(t, ctx, chromedp.Evaluate[bool](`window.pwned !== undefined || document.querySelector("#failing script, #failing img") !== null`)),
		"the hostile payload ran or became markup")

	// Fixed; the retries ran out into a dead letter; a replay clicked in the page heals it.
	awaitDeadLetter(t, client, "tickets")
	run1(t, overview, ticketsRow("failing", "1")) // the overview refreshed in place
	broken.Store(false)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(srv.URL+"/console/projections/tickets"),
		chromedp.Click(chromedp.ID("replay")),
		chromedp.WaitVisible(chromedp.ID("outcome")),
	))
	require.Contains(t, run1(t, ctx, chromedp.Text(chromedp.ID("outcome"))), "replayed 1 dead letter(s) of tickets (by browser test)")
	// The live refresh shows the projection caught up, without a reload.
	run1(t, ctx, chromedp.Poll[bool](`document.getElementById("condition").textContent === "caught_up"`, wait, every))
	run1(t, overview, ticketsRow("caught_up", "0"))

	// The parked stream is redriven from the page.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(srv.URL+"/console/projections/parker"),
		chromedp.WaitVisible(chromedp.CSS("#parked button.redrive")),
		chromedp.Click(chromedp.CSS("#parked button.redrive")),
		chromedp.WaitVisible(chromedp.ID("outcome")),
	))
	run1(t, ctx, chromedp.Poll[bool](`document.getElementById("no-parked") !== null`, wait, every))
	st, err := client.Status(t.Context(), "parker")
	require.NoError(t, err)
	require.Zero(t, st.ParkedStreams)

	// A POST from the page without the token is refused.
	code := run1(t, ctx, chromedp.Evaluate[int](`fetch("/console/actions/replay", {method: "POST",
		headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: "projection=tickets"}).then(r => r.status)`,
		chromedp.EvalAwaitPromise))
	require.Equal(t, http.StatusForbidden, code)

	// A read-only console, read with JavaScript off: the overview and the page read the same,
	// without a form; a POST is refused.
	require.NoError(t, chromedp.Do(ctx,
		scripts(false),
		chromedp.Navigate(srv.URL+"/ro/"),
		chromedp.WaitVisible(chromedp.ID("projections")),
	))
	require.Equal(t, "nudge-relay,parker,tickets", run1(t, ctx, chromedp.Evaluate[string](`Array.from(document.querySelectorAll("#projections tr[data-projection]"), r => r.dataset.projection).join()`)))
	require.Contains(t, run1(t, ctx, chromedp.Text(chromedp.CSS(`tr[data-projection="tickets"] td.condition`))), "caught_up")
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/ro/projections/parker"), chromedp.WaitVisible(chromedp.ID("condition"))))
	require.Zero(t, run1(t, ctx, chromedp.Evaluate[int](`document.forms.length`)), "a read-only page has no forms")
	require.NoError(t, chromedp.Do(ctx, scripts(true)))
	code = run1(t, ctx, chromedp.Evaluate[int](`fetch("/ro/actions/replay", {method: "POST",
		headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: "projection=tickets"}).then(r => r.status)`,
		chromedp.EvalAwaitPromise))
	require.Equal(t, http.StatusMethodNotAllowed, code, "read-only")
}

// run1 runs one action in the browser and returns its value.
func run1[T any](t *testing.T, ctx context.Context, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(ctx, a)
	require.NoError(t, err)
	return v
}

// scripts switches the page's scripts on or off.
func scripts(on bool) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		_, err := cdp.Call(ctx, tg, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: !on})
		return chromedp.Void{}, err
	}
}

// awaitDeadLetter waits until the projection has a failed dead letter.
func awaitDeadLetter(t *testing.T, client *nudge.Client, name string) {
	t.Helper()
	ctx := testwait.Context(t, time.Minute)
	for {
		recs, err := client.DeadLetters().List(ctx, deadletter.Filter{Projection: name, Status: []deadletter.Status{deadletter.StatusFailed}})
		require.NoError(t, err)
		if len(recs) > 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no dead letter for %s", name)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// run migrates and runs a client until the test ends.
func run(t *testing.T, pool *pgxpool.Pool, cfg nudge.Config) *nudge.Client {
	t.Helper()
	client, err := nudge.New(pool, cfg)
	require.NoError(t, err)
	require.NoError(t, client.Migrate(t.Context()))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = client.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	select {
	case <-client.Running():
	case <-testwait.Context(t, time.Minute).Done():
		t.Fatal("the client did not start")
	}
	return client
}
