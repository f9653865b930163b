// Package console serves nudge's operator console: an http.Handler with an overview of every
// projection, a page per projection and per dead letter, refreshing live, and — only when
// built with Config.Writes — the operators' actions (replay, resolve, redrive, skip, rebuild,
// pause, resume).
//
// Mount it in your own server behind your own authentication, as riverui is mounted:
//
//	h, err := console.New(console.Config{DB: pool, Channel: ch, BasePath: "/console"})
//	mux.Handle("/console/", requireOperator(h))
//
// or run it from the command line with 'nudge console --listen 127.0.0.1:8080'. Pages are
// rendered on the server (html/template) and readable with JavaScript off; a small embedded
// script refreshes them in place. Every text from events, errors or the database is escaped,
// control characters shown as \x1b and the like.
package console

import (
	"cmp"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	dlpg "github.com/nudgeworks/nudge/deadletter/postgres"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/postgres"
	pjpg "github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/trigger"
)

// ActorDefault is who acts when Config.ActorHeader is unset or the request lacks it.
const ActorDefault = "nudge console"

// ErrInvalidConfig is matched (errors.Is) by every error New returns for a Config it cannot use.
var ErrInvalidConfig = errors.New("console: invalid config")

// Config configures the console.
type Config struct {
	// DB is the database holding nudge's tables (a *pgxpool.Pool). Required.
	DB postgres.DB
	// Schema holds nudge's tables. Defaults to "", the connection's search_path.
	Schema string
	// Channel sends the actions' requests (replay, redrive, skip, rebuild) to the projections'
	// workers: the channel they consume from. Required when Writes is true.
	Channel trigger.Publisher
	// Writes enables the actions. Defaults to false: the console only reads, and refuses
	// every POST with 405.
	Writes bool
	// ActorHeader names the request header the host sets to who is signed in (e.g.
	// "X-Forwarded-User"); its value is recorded as who acted. Defaults to "": every action
	// is recorded as Actor.
	ActorHeader string
	// Actor is who acts when ActorHeader is unset or absent from a request. Defaults to
	// ActorDefault.
	Actor string
	// BasePath is the path the console is mounted under, e.g. "/console"; its links and
	// forms start with it, and it strips it from requests. Defaults to "" (the root).
	BasePath string
	// Secret keys the CSRF tokens and the signature of the outcome an action's page shows.
	// Defaults to 32 random bytes per handler (tokens then die with the process); set it to
	// share them between replicas.
	Secret []byte
	// Logger logs every action (who, what, outcome). Defaults to slog.Default().
	Logger *slog.Logger
}

//go:embed assets
var assets embed.FS

// console is the handler.
type console struct {
	cfg      Config
	backend  *pjpg.Backend
	dead     *dlpg.Store
	events   string // the events table, schema-qualified
	pages    *template.Template
	mux      *http.ServeMux
	log      *slog.Logger
	basePath string
	rates    *throughput
	now      func() time.Time
}

// New returns the console's handler.
func New(cfg Config) (http.Handler, error) {
	if cfg.DB == nil {
		return nil, fmt.Errorf("%w: Config.DB is nil; pass the pool of nudge's database", ErrInvalidConfig)
	}
	if cfg.Writes && cfg.Channel == nil {
		return nil, fmt.Errorf("%w: Config.Writes needs Config.Channel, the channel the workers consume from", ErrInvalidConfig)
	}
	base := strings.TrimRight(cfg.BasePath, "/")
	if base != "" && !strings.HasPrefix(base, "/") {
		return nil, fmt.Errorf("%w: Config.BasePath %q must start with /", ErrInvalidConfig, cfg.BasePath)
	}
	cfg.Actor = cmp.Or(strings.TrimSpace(cfg.Actor), ActorDefault)
	if len(cfg.Secret) == 0 {
		cfg.Secret = make([]byte, 32)
		_, _ = rand.Read(cfg.Secret)
	}
	store, err := espg.New(cfg.DB, espg.Config{Schema: cfg.Schema})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	backend, err := pjpg.New(store)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	dead, err := dlpg.New(cfg.DB, dlpg.Config{Schema: cfg.Schema})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	pages, err := template.New("").Funcs(funcs).ParseFS(assets, "assets/*.html")
	if err != nil {
		return nil, fmt.Errorf("console: parse the templates: %w", err)
	}
	c := &console{cfg: cfg, backend: backend, dead: dead, events: table(cfg.Schema, "nudge_events"), pages: pages,
		log: cmp.Or(cfg.Logger, slog.Default()), basePath: base, rates: newThroughput(), now: time.Now}
	c.routes()
	return c, nil
}

func (c *console) routes() {
	static, _ := fs.Sub(assets, "assets")
	m := http.NewServeMux()
	m.HandleFunc("GET /{$}", c.overview)
	m.HandleFunc("GET /live/overview", c.overviewLive)
	m.HandleFunc("GET /projections/{name}", c.projectionPage)
	m.HandleFunc("GET /live/projections/{name}", c.projectionLive)
	m.HandleFunc("GET /deadletters/{id}", c.deadLetterPage)
	m.HandleFunc("POST /actions/{action}", c.act)
	m.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	c.mux = m
}

// ServeHTTP strips BasePath and serves the console, with headers that keep pages from
// running anything but the console's own script.
func (c *console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	if c.basePath == "" {
		c.mux.ServeHTTP(w, r)
		return
	}
	http.StripPrefix(c.basePath, c.mux).ServeHTTP(w, r)
}

// actor is who acts in r.
func (c *console) actor(r *http.Request) string {
	if c.cfg.ActorHeader != "" {
		if v := strings.TrimSpace(r.Header.Get(c.cfg.ActorHeader)); v != "" {
			return v
		}
	}
	return c.cfg.Actor
}
