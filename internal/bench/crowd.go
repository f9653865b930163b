package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/internal/backoff"
)

// Sizes and bounds of a crowd.
const (
	// crowdHold is how long a writer holds its transaction open after its insert.
	crowdHold = 20 * time.Millisecond
	// crowdMaxLife bounds a crowd's writers in time; crowdMaxTransactions in count, per writer.
	crowdMaxLife         = 3 * time.Minute
	crowdMaxTransactions = int(crowdMaxLife / crowdHold)
	// crowdDialers is how many connections are opened at once.
	crowdDialers = 8
	// crowdScratchSQL creates the writers' table in the crowd's database.
	crowdScratchSQL = `CREATE TABLE IF NOT EXISTS bench_crowd_scratch (writer int NOT NULL, n int NOT NULL, at timestamptz NOT NULL DEFAULT now())`
	crowdInsertSQL  = `INSERT INTO bench_crowd_scratch (writer, n) VALUES ($1, $2)`
)

// crowd is many open connections to one database: idle ones, some of them idle in a
// transaction that has no id, and writers, each in a loop of transactions that insert a row
// and stay open for crowdHold before they commit, so that one holds a transaction id most of
// the time.
type crowd struct {
	conns   []*pgx.Conn
	idleTx  []pgx.Tx
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	commits atomic.Int64
	started time.Time

	mu  sync.Mutex
	err error // the first writer's failure
}

// crowdConfig says what a crowd holds.
type crowdConfig struct {
	url string
	// idle connections, of which every idleTxEvery-th sits idle in a transaction without an id.
	idle        int
	idleTxEvery int
	writers     int
	// writeTx are the writers' transaction options (the store's exemption from its horizon).
	writeTx pgx.TxOptions
}

// openCrowd opens the connections and starts the writers; close ends them. The writers stop
// at close, when ctx ends, after crowdMaxLife, or after crowdMaxTransactions each.
func openCrowd(ctx context.Context, cfg crowdConfig) (*crowd, error) {
	c := &crowd{}
	conns, err := dialMany(ctx, cfg.url, cfg.idle+cfg.writers)
	c.conns = conns
	if err != nil {
		c.close()
		return nil, err
	}
	if _, err := conns[0].Exec(ctx, crowdScratchSQL); err != nil {
		c.close()
		return nil, fmt.Errorf("create the crowd's scratch table: %w", err)
	}
	for i, conn := range conns[:cfg.idle] {
		if cfg.idleTxEvery > 0 && i%cfg.idleTxEvery == cfg.idleTxEvery-1 {
			tx, err := conn.Begin(ctx)
			if err != nil {
				c.close()
				return nil, fmt.Errorf("begin an idle transaction: %w", err)
			}
			c.idleTx = append(c.idleTx, tx)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, crowdMaxLife)
	c.cancel, c.started = cancel, time.Now()
	for i, conn := range conns[cfg.idle:] {
		c.wg.Add(1)
		go c.write(wctx, conn, i, cfg.writeTx)
	}
	return c, nil
}

// dialMany opens n connections to url, crowdDialers at a time. It returns those it opened,
// also on error.
func dialMany(ctx context.Context, url string, n int) ([]*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	// The writers' commits need not wait for the disk: what is measured is the transactions
	// they hold open, not the WAL flushes.
	cfg.RuntimeParams["synchronous_commit"] = "off"
	cfg.RuntimeParams["application_name"] = "nudge_bench_crowd"
	conns := make([]*pgx.Conn, n)
	errs := make([]error, n)
	next := atomic.Int64{}
	var wg sync.WaitGroup
	for range min(crowdDialers, n) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				dctx, cancel := context.WithTimeout(ctx, setupTimeout)
				conns[i], errs[i] = pgx.ConnectConfig(dctx, cfg)
				cancel()
			}
		})
	}
	wg.Wait()
	opened := make([]*pgx.Conn, 0, n)
	for _, conn := range conns {
		if conn != nil {
			opened = append(opened, conn)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return opened, fmt.Errorf("open %d connections (%d opened): %w", n, len(opened), err)
	}
	if err := ctx.Err(); err != nil {
		return opened, err
	}
	return opened, nil
}

// write runs one writer's loop.
func (c *crowd) write(ctx context.Context, conn *pgx.Conn, id int, opts pgx.TxOptions) {
	defer c.wg.Done()
	for n := 0; n < crowdMaxTransactions && ctx.Err() == nil; n++ {
		if err := writeOnce(ctx, conn, id, n, opts); err != nil {
			if ctx.Err() == nil {
				c.fail(fmt.Errorf("writer %d: %w", id, err))
			}
			return
		}
		c.commits.Add(1)
	}
}

// writeOnce inserts a row in a transaction that it holds open for crowdHold before it commits.
func writeOnce(ctx context.Context, conn *pgx.Conn, id, n int, opts pgx.TxOptions) error {
	tx, err := conn.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = tx.Rollback(rctx) // a no-op after Commit
	}()
	if _, err := tx.Exec(ctx, crowdInsertSQL, id, n); err != nil {
		return err
	}
	if err := backoff.Sleep(ctx, crowdHold); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func (c *crowd) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
	}
}

// failure returns the first writer's failure, nil while none failed.
func (c *crowd) failure() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// commitRate is the writers' commits per second so far.
func (c *crowd) commitRate() float64 { return Rate(int(c.commits.Load()), time.Since(c.started)) }

// close stops the writers, rolls the idle transactions back and closes every connection. It
// may be called more than once.
func (c *crowd) close() {
	if c.cancel != nil {
		c.cancel()
	}
	c.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	for _, tx := range c.idleTx {
		_ = tx.Rollback(ctx)
	}
	c.idleTx = nil
	for _, conn := range c.conns {
		_ = conn.Close(ctx)
	}
	c.conns = nil
}
