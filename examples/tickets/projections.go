package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/projection"
)

// Projection names: they name the projections' status rows, queues and dead letters.
const (
	ProjectionTicketList  = "ticket_list"
	ProjectionTicketStats = "ticket_stats"
)

// TicketStatus is a ticket's status in the ticket_list read model.
type TicketStatus string

const (
	// StatusOpen: registered, not closed.
	StatusOpen TicketStatus = "open"
	// StatusClosed: closed.
	StatusClosed TicketStatus = "closed"
)

// TicketStatuses lists every ticket status.
func TicketStatuses() []TicketStatus { return []TicketStatus{StatusOpen, StatusClosed} }

// readModels defines the two projections and names their tables, in the configured schema
// (the search_path when it is empty), next to nudge's own tables.
type readModels struct {
	titleWidth int
	log        *slog.Logger
	// listVersion is the version of ticket_list to define (Config.ListVersion); 0 is 1.
	listVersion int
	// listV2Hook is Config.listV2Hook.
	listV2Hook func(ctx context.Context, replaying bool) error
	// Sanitized, schema-qualified table names. list is the name readers query: version 1's
	// table, or the view of the active version's once a version 2 was deployed; listV2 is
	// version 2's table.
	list, listV2, stats, statsTickets string
}

func newReadModels(schema string, titleWidth int, log *slog.Logger) readModels {
	table := func(name string) string {
		if schema == "" {
			return pgx.Identifier{name}.Sanitize()
		}
		return pgx.Identifier{schema, name}.Sanitize()
	}
	return readModels{titleWidth: titleWidth, log: log,
		list: table("ticket_list"), listV2: table(projection.TableName("ticket_list", 2)),
		stats: table("ticket_stats"), statsTickets: table("ticket_stats_tickets")}
}

// projections returns ticket_list and ticket_stats.
func (m readModels) projections() ([]*projection.Projection, error) {
	list, err := m.ticketList()
	if err != nil {
		return nil, err
	}
	stats, err := m.ticketStats()
	if err != nil {
		return nil, err
	}
	return []*projection.Projection{list, stats}, nil
}

// ticketList is the list of tickets the API serves, one row per ticket. Its handlers write
// through the batch's transaction (projection.On), which commits the rows together with the
// projection's position: every event is applied exactly once, so a plain INSERT is right.
//
// Its title column holds m.titleWidth characters while the API accepts MaxTitleLength: a
// longer title fails the INSERT ("value too long for type character varying(100)"). That event
// is the poison of README.md; the fix is to start with a wider --title-width, which the init
// hook applies.
func (m readModels) ticketList() (*projection.Projection, error) {
	if m.listVersion == 2 {
		return m.ticketListV2()
	}
	return projection.New(ProjectionTicketList, projection.Config{
		InitFunc: m.initTicketList,
		ResetFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `TRUNCATE `+m.list)
			return err
		},
	},
		projection.On(TypeTicketRegistered, func(ctx context.Context, tx pgx.Tx, e projection.Event[TicketRegistered]) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+m.list+` (id, title, customer, status, opened_at)
				VALUES ($1, $2, $3, $4, $5)`, e.Data.ID, e.Data.Title, e.Data.Customer, StatusOpen, e.RecordedAt)
			return err
		}),
		projection.On(TypeTicketClosed, func(ctx context.Context, tx pgx.Tx, e projection.Event[TicketClosed]) error {
			_, err := tx.Exec(ctx, `UPDATE `+m.list+` SET status = $2, closed_at = $3, close_reason = $4 WHERE id = $1`,
				e.Data.ID, StatusClosed, e.RecordedAt, e.Data.Reason)
			return err
		}),
	)
}

// initTicketList creates ticket_list, and widens its title column when the configured width
// is larger than the table's (never narrower: that could fail on rows already there). It runs
// at every start, in a transaction that holds the projection's lock, so two processes
// starting at once do not race.
func (m readModels) initTicketList(ctx context.Context, p projection.HookParams) error {
	_, err := p.Tx.Exec(ctx, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
		id           text PRIMARY KEY,
		title        varchar(%d) NOT NULL,
		customer     text NOT NULL,
		status       text NOT NULL,
		opened_at    timestamptz NOT NULL,
		closed_at    timestamptz,
		close_reason text
	)`, m.list, m.titleWidth))
	if err != nil {
		return err
	}
	if _, err := p.Tx.Exec(ctx, `CREATE INDEX IF NOT EXISTS ticket_list_status_opened ON `+m.list+` (status, opened_at)`); err != nil {
		return err
	}
	var width int // varchar(n) has atttypmod n + 4
	if err := p.Tx.QueryRow(ctx, `SELECT atttypmod - 4 FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'title'`,
		m.list).Scan(&width); err != nil {
		return fmt.Errorf("read the width of ticket_list.title: %w", err)
	}
	if width > 0 && width < m.titleWidth {
		if _, err := p.Tx.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s ALTER COLUMN title TYPE varchar(%d)`, m.list, m.titleWidth)); err != nil {
			return fmt.Errorf("widen ticket_list.title: %w", err)
		}
		m.log.InfoContext(ctx, "widened the title column", slog.String("projection", p.Projection),
			slog.Int("from", width), slog.Int("to", m.titleWidth))
	}
	return nil
}

// ticketListV2 is version 2 of ticket_list: version 1's columns and resolution_seconds, how
// long a closed ticket was open, which version 1 does not keep. Its title is text, as long as
// the API accepts (--title-width is version 1's: a table under a view cannot change a column's
// type, a new version can). Deployed beside version 1
// (--ticket-list-version 2), it registers as the unit ticket_list.v2, adopts version 1's table
// (renamed ticket_list_v1; ticket_list becomes a view of it, which version 1's code keeps
// writing through), builds ticket_list_v2 from the start of the store while version 1 serves,
// and cuts over by itself once level: ticket_list is then a view of ticket_list_v2, in one
// transaction. Readers query ticket_list throughout. Its DeleteFunc drops ticket_list_v2
// when a version 3 has replaced it.
func (m readModels) ticketListV2() (*projection.Projection, error) {
	hook := func(ctx context.Context) error {
		if m.listV2Hook == nil {
			return nil
		}
		return m.listV2Hook(ctx, projection.Replaying(ctx))
	}
	return projection.New(ProjectionTicketList, projection.Config{
		Version: 2,
		Tables:  []string{"ticket_list"},
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+m.listV2+` (
				id                 text PRIMARY KEY,
				title              text NOT NULL,
				customer           text NOT NULL,
				status             text NOT NULL,
				opened_at          timestamptz NOT NULL,
				closed_at          timestamptz,
				close_reason       text,
				resolution_seconds double precision
			);
			CREATE INDEX IF NOT EXISTS ticket_list_v2_status_opened ON `+m.listV2+` (status, opened_at)`)
			return err
		},
		ResetFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `TRUNCATE `+m.listV2)
			return err
		},
		DeleteFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `DROP TABLE IF EXISTS `+m.listV2)
			return err
		},
	},
		projection.On(TypeTicketRegistered, func(ctx context.Context, tx pgx.Tx, e projection.Event[TicketRegistered]) error {
			if err := hook(ctx); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+m.listV2+` (id, title, customer, status, opened_at)
				VALUES ($1, $2, $3, $4, $5)`, e.Data.ID, e.Data.Title, e.Data.Customer, StatusOpen, e.RecordedAt)
			return err
		}),
		projection.On(TypeTicketClosed, func(ctx context.Context, tx pgx.Tx, e projection.Event[TicketClosed]) error {
			if err := hook(ctx); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE `+m.listV2+` SET status = $2, closed_at = $3, close_reason = $4,
				resolution_seconds = extract(epoch FROM $3::timestamptz - opened_at) WHERE id = $1`,
				e.Data.ID, StatusClosed, e.RecordedAt, e.Data.Reason)
			return err
		}),
	)
}

// ticketStats counts open and closed tickets per customer. It is an aggregate, so it is written
// set-based, once per batch, in the flush hook: three statements per batch whatever its size,
// instead of two per event (see README.md, "Two ways to write a read model"). Its handlers
// only check each event, so an event it could not count is named exactly in the status and
// the dead letter; a failing flush would be charged to the batch's first event.
//
// TicketClosed does not carry the customer, and ticket_stats must not read ticket_list (a
// projection that fails would hold this one back): it keeps the customer of each ticket in a
// table of its own, ticket_stats_tickets.
func (m readModels) ticketStats() (*projection.Projection, error) {
	return projection.New(ProjectionTicketStats, projection.Config{
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			if _, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+m.stats+` (
				customer text PRIMARY KEY,
				open     integer NOT NULL,
				closed   integer NOT NULL
			)`); err != nil {
				return err
			}
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+m.statsTickets+` (
				id       text PRIMARY KEY,
				customer text NOT NULL,
				closed   boolean NOT NULL DEFAULT false
			)`)
			return err
		},
		ResetFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `TRUNCATE `+m.stats+`, `+m.statsTickets)
			return err
		},
		FlushFunc: m.flushStats,
	},
		projection.On(TypeTicketRegistered, func(_ context.Context, _ pgx.Tx, e projection.Event[TicketRegistered]) error {
			if e.Data.ID == "" || e.Data.Customer == "" {
				return errors.New("a registration needs an id and a customer to be counted")
			}
			return nil
		}),
		projection.On(TypeTicketClosed, func(_ context.Context, _ pgx.Tx, e projection.Event[TicketClosed]) error {
			if e.Data.ID == "" {
				return errors.New("a closing needs a ticket id to be counted")
			}
			return nil
		}),
	)
}

// flushStats applies a batch of events to ticket_stats in three statements.
func (m readModels) flushStats(ctx context.Context, p projection.FlushParams) error {
	var registeredIDs, registeredCustomers, closedIDs []string
	for _, e := range p.Events {
		switch e.Type {
		case TypeTicketRegistered:
			var r TicketRegistered
			if err := json.Unmarshal(e.Payload, &r); err != nil {
				return err // the handler decoded it already: cannot happen
			}
			registeredIDs, registeredCustomers = append(registeredIDs, r.ID), append(registeredCustomers, r.Customer)
		case TypeTicketClosed:
			var c TicketClosed
			if err := json.Unmarshal(e.Payload, &c); err != nil {
				return err
			}
			closedIDs = append(closedIDs, c.ID)
		}
	}
	type delta struct{ open, closed int }
	deltas := map[string]*delta{}
	add := func(rows pgx.Rows, open, closed int) error {
		customers, err := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, c := range customers {
			if deltas[c] == nil {
				deltas[c] = &delta{}
			}
			deltas[c].open += open
			deltas[c].closed += closed
		}
		return err
	}
	// 1. Remember each new ticket's customer; RETURNING counts only rows really inserted.
	if len(registeredIDs) > 0 {
		rows, err := p.Tx.Query(ctx, `INSERT INTO `+m.statsTickets+` (id, customer)
			SELECT * FROM unnest($1::text[], $2::text[]) ON CONFLICT (id) DO NOTHING RETURNING customer`,
			registeredIDs, registeredCustomers)
		if err != nil {
			return err
		}
		if err := add(rows, 1, 0); err != nil {
			return err
		}
	}
	// 2. Close tickets (registered in this batch or before) and learn their customers.
	if len(closedIDs) > 0 {
		rows, err := p.Tx.Query(ctx, `UPDATE `+m.statsTickets+` SET closed = true
			WHERE id = ANY($1::text[]) AND NOT closed RETURNING customer`, closedIDs)
		if err != nil {
			return err
		}
		if err := add(rows, -1, 1); err != nil {
			return err
		}
	}
	if len(deltas) == 0 {
		return nil
	}
	// 3. One upsert for every customer the batch touched.
	customers := make([]string, 0, len(deltas))
	for c := range deltas {
		customers = append(customers, c)
	}
	slices.Sort(customers)
	opens, closes := make([]int32, len(customers)), make([]int32, len(customers))
	for i, c := range customers {
		opens[i], closes[i] = int32(deltas[c].open), int32(deltas[c].closed)
	}
	_, err := p.Tx.Exec(ctx, `INSERT INTO `+m.stats+` AS s (customer, open, closed)
		SELECT * FROM unnest($1::text[], $2::int[], $3::int[])
		ON CONFLICT (customer) DO UPDATE SET open = s.open + excluded.open, closed = s.closed + excluded.closed`,
		customers, opens, closes)
	return err
}
