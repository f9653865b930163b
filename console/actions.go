package console

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/name"
	"github.com/nudgeworks/nudge/projection"
	pjpg "github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/trigger"
)

// Action names an operator's action, the last element of its POST path.
type Action string

const (
	// ActionReplay replays the projection's failed and replayed dead letters (form field
	// projection), as 'nudge deadletter replay --projection' does.
	ActionReplay Action = "replay"
	// ActionResolve resolves one dead letter (form fields id, note).
	ActionResolve Action = "resolve"
	// ActionRedrive asks the projection's worker to redrive its parked streams (form fields
	// projection, stream: one stream, or every one when empty), as 'nudge parked redrive' does.
	ActionRedrive Action = "redrive"
	// ActionSkip asks the projection's worker to skip the event it fails on (form fields
	// projection, event, confirm: the event's id typed back, reason), as 'nudge skip' does.
	ActionSkip Action = "skip"
	// ActionRebuild asks the projection's worker to rebuild it (form fields projection, at:
	// the database's time of the form), as 'nudge rebuild' does.
	ActionRebuild Action = "rebuild"
	// ActionPause pauses the projection (form field projection) in every process, as
	// 'nudge pause' and Runner.PauseBy do: its batches stop until a resume. Who paused it and
	// when are recorded in its status row (projection.Status.StateChangedBy, StateChangedAt).
	ActionPause Action = "pause"
	// ActionResume resumes a paused projection (form field projection), recording who and
	// when, and nudges it to catch up, as 'nudge resume' does.
	ActionResume Action = "resume"
)

// Actions returns every action.
func Actions() []Action {
	return []Action{ActionReplay, ActionResolve, ActionRedrive, ActionSkip, ActionRebuild, ActionPause, ActionResume}
}

// errRefused is an action refused for what the form holds (400).
var errRefused = errors.New("refused")

// act runs a POSTed action: refused with 405 when the console only reads, with 403 without
// the CSRF token; then it is done, logged with who did it, and the browser is sent to the
// page that shows its outcome.
func (c *console) act(w http.ResponseWriter, r *http.Request) {
	if !c.cfg.Writes {
		w.Header().Set("Allow", "GET")
		http.Error(w, "this console is read-only: it was built without console.Config.Writes", http.StatusMethodNotAllowed)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if !c.csrfValid(r) {
		http.Error(w, "refused: the form's CSRF token is missing or wrong; reload the page and try again", http.StatusForbidden)
		return
	}
	by, action := c.actor(r), Action(r.PathValue("action"))
	back, outcome, err := c.do(r.Context(), action, r, by)
	log := c.log.With(slog.String("action", string(action)), slog.String("by", by),
		slog.String("projection", r.PostFormValue("projection")))
	if err != nil {
		log.Warn("console: action failed", slog.Any("error", err))
		c.render(w, r, "error", page{}, err)
		return
	}
	log.Info("console: action done", slog.String("outcome", outcome))
	q := url.Values{"done": {outcome}, "sig": {c.mac("outcome", outcome)}}
	http.Redirect(w, r, c.basePath+back+"?"+q.Encode(), http.StatusSeeOther)
}

// do runs action; it returns the path to show its outcome on and the outcome in words.
func (c *console) do(ctx context.Context, action Action, r *http.Request, by string) (back, outcome string, err error) {
	n := r.PostFormValue("projection")
	if action != ActionResolve {
		if err := name.Validate(n); err != nil {
			return "", "", fmt.Errorf("%w: %w", errRefused, err)
		}
		back = "/projections/" + n
	}
	switch action {
	case ActionReplay:
		outcome, err = c.replay(ctx, n, by)
	case ActionResolve:
		return c.resolve(ctx, r.PostFormValue("id"), r.PostFormValue("note"), by)
	case ActionRedrive:
		outcome, err = c.redrive(ctx, n, r.PostFormValue("stream"), by)
	case ActionSkip:
		outcome, err = c.skip(ctx, n, r.PostFormValue("event"), r.PostFormValue("confirm"), r.PostFormValue("reason"), by)
	case ActionRebuild:
		outcome, err = c.rebuild(ctx, n, r.PostFormValue("at"), by)
	case ActionPause, ActionResume:
		outcome, err = c.setPaused(ctx, n, action == ActionPause, by)
	default:
		return "", "", fmt.Errorf("%w: unknown action %q", errRefused, action)
	}
	return back, outcome, err
}

func (c *console) replay(ctx context.Context, n, by string) (string, error) {
	res, err := deadletter.Replay(ctx, c.dead, c.cfg.Channel, deadletter.ReplayFilter{Projection: n}, by, time.Time{})
	if errors.Is(err, deadletter.ErrNotFound) {
		// Nothing to replay: a catch-up trigger still nudges the projection, as a replay would.
		if err := c.cfg.Channel.Publish(ctx, trigger.Trigger{Projection: n, Reason: trigger.ReasonAppend, At: time.Now().UTC()}); err != nil {
			return "", fmt.Errorf("trigger %s: %w", n, err)
		}
		return fmt.Sprintf("no dead letters to replay; triggered %s to catch up (by %s)", n, by), nil
	}
	if err != nil {
		return "", fmt.Errorf("replay the dead letters of %s: %w", n, err)
	}
	return fmt.Sprintf("replayed %d dead letter(s) of %s (by %s)", res.Replayed, n, by), nil
}

func (c *console) resolve(ctx context.Context, idText, note, by string) (back, outcome string, err error) {
	id, err := strconv.ParseInt(idText, 10, 64)
	if err != nil {
		return "", "", fmt.Errorf("%w: %q is not a dead letter's id", errRefused, idText)
	}
	back = "/deadletters/" + idText
	rec, err := c.dead.Get(ctx, id)
	if err != nil {
		return "", "", err
	}
	if rec.Status == deadletter.StatusResolved {
		return back, fmt.Sprintf("dead letter %d was already resolved by %s at %s; nothing changed", id, rec.ResolvedBy,
			rec.ResolvedAt.UTC().Format(time.RFC3339)), nil
	}
	if err := c.dead.Resolve(ctx, id, by, note, time.Time{}); err != nil {
		return "", "", fmt.Errorf("resolve dead letter %d: %w", id, err)
	}
	return back, fmt.Sprintf("resolved dead letter %d (by %s)", id, by), nil
}

func (c *console) redrive(ctx context.Context, n, stream, by string) (string, error) {
	parked, err := c.backend.ParkedStreams(ctx, pjpg.ParkedFilter{Projection: n, StreamID: stream})
	if err != nil {
		return "", fmt.Errorf("read the parked streams of %s: %w", n, err)
	}
	if len(parked) == 0 {
		return "nothing is parked there any more; nothing to redrive", nil
	}
	req := trigger.RedriveRequest{Stream: stream, By: by}
	if err := c.cfg.Channel.Publish(ctx, trigger.Trigger{Projection: n, Reason: trigger.ReasonRedrive, At: time.Now().UTC(), Redrive: &req}); err != nil {
		return "", fmt.Errorf("send the redrive request to %s's worker: %w", n, err)
	}
	what := fmt.Sprintf("%d parked stream(s)", len(parked))
	if stream != "" {
		what = "stream " + stream
	}
	return fmt.Sprintf("asked the worker of %s to redrive %s (by %s)", n, what, by), nil
}

func (c *console) skip(ctx context.Context, n, event, confirm, reason, by string) (string, error) {
	id, err := uuid.Parse(event)
	switch {
	case err != nil:
		return "", fmt.Errorf("%w: %q is not an event id", errRefused, event)
	case strings.TrimSpace(confirm) != id.String():
		return "", fmt.Errorf("%w: type the event's id %s to confirm the skip", errRefused, id)
	case strings.TrimSpace(reason) == "":
		return "", fmt.Errorf("%w: give a reason; it is recorded with the skip", errRefused)
	}
	st, err := c.backend.StatusOf(ctx, n)
	if errors.Is(err, projection.ErrNotRegistered) {
		return "", fmt.Errorf("%w: %s", errNoProjection, n)
	}
	if err != nil {
		return "", fmt.Errorf("read the status of %s: %w", n, err)
	}
	if k := st.LastSkip; k != nil && k.Event.ID == id {
		return fmt.Sprintf("event %s was already skipped by %s", id, k.By), nil
	}
	if st.FailingEvent == nil || st.FailingEvent.ID != id {
		return "", fmt.Errorf("%w: %s no longer fails on event %s", errRefused, n, id)
	}
	req := trigger.SkipRequest{EventID: id, Reason: reason, By: by}
	if err := c.cfg.Channel.Publish(ctx, trigger.Trigger{Projection: n, Reason: trigger.ReasonSkip, At: time.Now().UTC(), Skip: &req}); err != nil {
		return "", fmt.Errorf("send the skip request to %s's worker: %w", n, err)
	}
	return fmt.Sprintf("asked the worker of %s to skip event %s (by %s)", n, id, by), nil
}

func (c *console) rebuild(ctx context.Context, n, atText, by string) (string, error) {
	at, err := time.Parse(time.RFC3339Nano, atText)
	if err != nil {
		return "", fmt.Errorf("%w: the form's time %q is not RFC 3339; reload the page", errRefused, atText)
	}
	// The worker rebuilds only if the last rebuild started before at: the same form sent twice
	// starts one rebuild.
	req := trigger.RebuildRequest{By: by}
	if err := c.cfg.Channel.Publish(ctx, trigger.Trigger{Projection: n, Reason: trigger.ReasonRebuild, At: at.UTC(), Rebuild: &req}); err != nil {
		return "", fmt.Errorf("send the rebuild request to %s's worker: %w", n, err)
	}
	return fmt.Sprintf("asked the worker of %s to rebuild it (by %s)", n, by), nil
}

// setPaused pauses (or resumes) the projection in every process, recording by and the time
// in its status row; a resume also publishes a catch-up trigger, so the projection reads on at
// once rather than at its next trigger or safety-net tick. Both are idempotent: pausing a
// paused projection changes nothing, and says who paused it and since when.
func (c *console) setPaused(ctx context.Context, n string, pause bool, by string) (string, error) {
	to, from, verb := projection.StatePaused, []projection.State(nil), "paused"
	if !pause {
		to, from, verb = projection.StateRunning, []projection.State{projection.StatePaused}, "resumed"
	}
	changed, err := c.backend.SetStateOfBy(ctx, n, by, to, from...)
	if err != nil {
		return "", err
	}
	if !changed {
		return c.unchanged(ctx, n, pause), nil
	}
	if !pause {
		if err := c.cfg.Channel.Publish(ctx, trigger.Trigger{Projection: n, Reason: trigger.ReasonAppend, At: time.Now().UTC()}); err != nil {
			return "", fmt.Errorf("resumed %s, but its catch-up trigger failed (it catches up at its next trigger): %w", n, err)
		}
	}
	return fmt.Sprintf("%s %s (by %s)", verb, n, by), nil
}

// unchanged says that a pause or resume of n changed nothing: it was paused already (by whom,
// since when) or not paused.
func (c *console) unchanged(ctx context.Context, n string, pause bool) string {
	if !pause {
		return fmt.Sprintf("%s was already not paused: nothing changed", n)
	}
	what := "paused"
	if st, err := c.backend.StatusOf(ctx, n); err == nil {
		if st.StateChangedBy != "" {
			what += " by " + st.StateChangedBy
		}
		if !st.StateChangedAt.IsZero() {
			what += " since " + st.StateChangedAt.UTC().Format(time.RFC3339)
		}
	}
	return fmt.Sprintf("%s was already %s: nothing changed", n, what)
}
